"""``NoopElimination`` (level-1 rule): ``x + 0``, ``x - 0``, ``x * 1``, ``x / 1`` with a constant
operand that does not broadcast the result are removed."""

from __future__ import annotations

from onnx_remat.ortsim.graph import RuntimeGraph, RuntimeNode, constant_value, rank
from onnx_remat.ortsim.rewrites.base import NodeRule

_NOOP_IDENTITY = {
    ("", "Add"): (0.0, (0, 1)),
    ("", "Sub"): (0.0, (1,)),
    ("", "Mul"): (1.0, (0, 1)),
    ("", "Div"): (1.0, (1,)),
}


def _noop_elimination(rg: RuntimeGraph, node: RuntimeNode) -> bool:
    """``NoopElimination``: Add/Sub of a constant 0, Mul/Div by a constant 1 (one element, no broadcast)."""
    if len(node.inputs) != 2 or rg.produces_graph_output(node):
        return False
    identity, sides = _NOOP_IDENTITY[node.key]
    for k in sides:
        c, other = node.inputs[k], node.inputs[1 - k]
        if not rg.is_constant(c):
            continue
        value = constant_value(rg, c)
        if value is None or value.size != 1 or float(value.reshape(-1)[0]) != identity:
            continue
        other_rank = rank(rg, other)
        if other_rank is None or value.ndim > other_rank:
            continue
        if rg.node_of(other) is None:
            continue  # onnxruntime keeps the node when the other input is a graph input (measured)
        rg.rewire(node.outputs[0], other)
        rg.remove(node)
        rg.rewrites["NoopElimination"] += 1
        return True
    return False


class NoopElimination(NodeRule):
    name = "NoopElimination"
    ops = frozenset(_NOOP_IDENTITY)

    def apply(self, rg: RuntimeGraph, node: RuntimeNode) -> bool:
        return _noop_elimination(rg, node)
