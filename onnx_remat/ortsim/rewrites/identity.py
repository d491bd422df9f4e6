"""``EliminateIdentity`` and ``CastElimination`` (level-1 rules): an Identity, or a Cast to the
type its input already has, is removed and its readers read its input."""

from __future__ import annotations

from onnx_remat.ortsim.graph import RuntimeGraph, RuntimeNode
from onnx_remat.ortsim.rewrites.base import NodeRule


def _cast_is_noop(rg: RuntimeGraph, node: RuntimeNode) -> bool:
    src = node.inputs[0] if node.inputs else ""
    return bool(src) and rg.sizes.elem_type(src) == node.attrs.get("to")


def _eliminate_identity(rg: RuntimeGraph, node: RuntimeNode, rule: str = "EliminateIdentity") -> bool:
    """``EliminateIdentity``: readers of the output read the input; or, when the output is a graph
    output read by no node, the producer writes the graph output directly."""
    if len([t for t in node.inputs if t]) != 1 or len([o for o in node.outputs if o]) != 1:
        return False
    src, out = node.inputs[0], node.outputs[0]
    if not rg.produces_graph_output(node):
        rg.rewire(out, src)
        rg.remove(node)
        rg.rewrites[rule] += 1
        return True
    # Identity -> graph output: only when nothing else reads the output and the producer's
    # tensor feeds this Identity alone and is no graph output itself.
    if rg.consumers.get(out):
        return False
    prod = rg.node_of(src)
    if prod is None or src in rg.graph_output_set or len(rg.consumers.get(src, ())) != 1:
        return False
    rg.remove(node)  # counts as an edit (rg.edits) for the output moved below too
    k = prod.outputs.index(src)
    prod.outputs = prod.outputs[:]  # a new list: see RuntimeNode.inputs
    prod.outputs[k] = out
    rg.touch(prod)
    rg._touch_readers([src, out])
    rg.producer.pop(src, None)
    rg.producer[out] = prod.index
    rg.rewrites[rule] += 1
    return True


class EliminateIdentity(NodeRule):
    name = "EliminateIdentity"
    ops = frozenset({("", "Identity")})

    def apply(self, rg: RuntimeGraph, node: RuntimeNode) -> bool:
        return _eliminate_identity(rg, node)


class CastElimination(NodeRule):
    name = "CastElimination"
    ops = frozenset({("", "Cast")})

    def apply(self, rg: RuntimeGraph, node: RuntimeNode) -> bool:
        return _cast_is_noop(rg, node) and _eliminate_identity(rg, node, rule=self.name)
