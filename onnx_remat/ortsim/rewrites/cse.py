"""``CommonSubexpressionElimination``: nodes of the same op, attributes and inputs become one
(random ops excepted); this is what merges naive recompute clones back into the originals."""

from __future__ import annotations

from onnx_remat.ortsim.graph import NOT_MERGED, RuntimeGraph, RuntimeNode
from onnx_remat.ortsim.rewrites.base import GraphPass


def _cse(rg: RuntimeGraph) -> bool:
    """``CommonSubexpressionElimination``: a deterministic node equal to an earlier one (op,
    attributes, inputs) is dropped and its readers read the earlier node's outputs."""
    seen = _Seen()
    changed = False
    nodes, graph_outputs = rg.nodes, rg.graph_output_set
    first_of = seen.first.setdefault
    for i in rg.default_order():
        node = nodes[i]
        if node is None or node.op in NOT_MERGED or not graph_outputs.isdisjoint(node.outputs):
            continue  # (the last: rg.produces_graph_output, inlined)
        # seen.earlier_equal, its first step inlined: most nodes are the first with their key
        key = (node.domain, node.op, tuple(node.inputs), len(node.outputs))
        if first_of(key, node) is node:
            continue
        first = seen.earlier_equal(node, key)
        if first is None:
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


class _Seen:
    """The nodes one CSE walk has seen, by (domain, op, inputs, output count) and attributes.

    Most nodes share their inputs with no earlier node of their op, so the attributes (the costly
    part of the key) are compared only between nodes equal in the rest. The walk edits only
    inputs, so a node's attributes are the same when compared as when it was seen."""

    def __init__(self) -> None:
        self.first: dict[tuple, RuntimeNode] = {}  # the first node seen with each key but attributes
        self.by_attrs: dict[tuple, dict[tuple, RuntimeNode]] = {}  # where several: by attributes

    def earlier_equal(self, node: RuntimeNode, key: tuple | None = None) -> RuntimeNode | None:
        """The first node seen equal to ``node``; None (and ``node`` is now seen) if none.
        ``key``: the node's key but attributes, if computed already."""
        if key is None:
            key = (node.domain, node.op, tuple(node.inputs), len(node.outputs))
        first = self.first.setdefault(key, node)
        if first is node:
            return None
        by_attrs = self.by_attrs.get(key)
        if by_attrs is None:
            by_attrs = self.by_attrs[key] = {_attr_key(first.attrs): first}
        earlier = by_attrs.setdefault(_attr_key(node.attrs), node)
        return None if earlier is node else earlier


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
