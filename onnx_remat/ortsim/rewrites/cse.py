"""``CommonSubexpressionElimination``: nodes of the same op, attributes and inputs become one
(random ops excepted); this is what merges naive recompute clones back into the originals."""

from __future__ import annotations

from onnx_remat.ortsim.graph import NOT_MERGED, RuntimeGraph, RuntimeNode
from onnx_remat.ortsim.rewrites.base import GraphPass


def _cse(rg: RuntimeGraph) -> bool:
    """``CommonSubexpressionElimination``: a deterministic node equal to an earlier one (op,
    attributes, inputs) is dropped and its readers read the earlier node's outputs."""
    seen: dict[tuple, RuntimeNode] = {}
    changed = False
    nodes, graph_outputs = rg.nodes, rg.graph_output_set
    for i in rg.default_order():
        node = nodes[i]
        if node is None or node.op in NOT_MERGED or not graph_outputs.isdisjoint(node.outputs):
            continue  # (the last: rg.produces_graph_output, inlined)
        try:
            key = (node.domain, node.op, tuple(node.inputs), len(node.outputs), _attr_key(node.attrs))
        except TypeError:
            continue
        first = seen.get(key)
        if first is None:
            seen[key] = node
            continue
        for mine, theirs in zip(node.outputs, first.outputs):
            if mine and theirs:
                rg.rewire(mine, theirs)
            elif mine:
                break
        else:
            rg.remove(node)
            rg.rewrites["CommonSubexpressionElimination"] += 1
            changed = True
    return changed


# Attribute values that are their own key (most are): asked for every node of every pass.
_PLAIN = frozenset({int, float, str, bytes, bool, type(None)})


def _attr_key(attrs: dict) -> tuple:
    if not attrs:
        return ()
    out = []
    for k in sorted(attrs):
        v = attrs[k]
        if type(v) not in _PLAIN:
            v = _value_key(v)
        out.append((k, v))
    return tuple(out)


def _value_key(v: object) -> object:
    """An attribute value as a hashable key: protos (and lists of them) by their serialization."""
    if isinstance(v, (list, tuple)):
        return tuple(x.SerializeToString() if hasattr(x, "SerializeToString") else x for x in v)
    if hasattr(v, "SerializeToString"):
        return v.SerializeToString()
    return v


class CommonSubexpressionElimination(GraphPass):
    name = "CommonSubexpressionElimination"

    def apply(self, rg: RuntimeGraph) -> bool:
        return _cse(rg)
