"""``CommonSubexpressionElimination``: nodes of the same op, attributes and inputs become one
(random ops excepted); this is what merges naive recompute clones back into the originals.

The optimizer repeats each level until nothing changes, so CSE walks the graph again after every
round in which another pass changed it, although on most graphs it merges nothing: a third of
the optimizer's time at 10^5 nodes. A walk that merged nothing is therefore kept
(:class:`_Unchanged`): when the graph has changed since, only the nodes the edits touched
(``RuntimeGraph.touched``) are looked up in it. Where none of them equals another node, the walk
would merge nothing again and is not made; otherwise it is made, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx_remat.ortsim.graph import EVERY_NODE, NOT_MERGED, RuntimeGraph, RuntimeNode
from onnx_remat.ortsim.rewrites.base import GraphPass


def _cse(rg: RuntimeGraph) -> tuple[bool, _Seen]:
    """``CommonSubexpressionElimination``: a deterministic node equal to an earlier one (op,
    attributes, inputs) is dropped and its readers read the earlier node's outputs. Returns
    whether it changed the graph, and the nodes the walk saw."""
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
    return changed, seen


def _mergeable(rg: RuntimeGraph, node: RuntimeNode | None) -> bool:
    """Whether CSE may merge ``node`` into another (a live node, deterministic, no graph output)."""
    return node is not None and node.op not in NOT_MERGED and rg.graph_output_set.isdisjoint(node.outputs)


@dataclass
class _Unchanged:
    """A CSE walk that edited nothing: every mergeable node's key (op, inputs, attributes) was
    then unique. ``seen``: the walk's table; ``at``: the length of ``RuntimeGraph.touched`` then.

    A node no edit has touched since has the same key now, so two such nodes still differ, and a
    merge needs a touched node equal to another one: :meth:`merges_nothing` looks up the touched
    nodes alone, in the walk's table (for untouched nodes) and among themselves."""

    seen: _Seen
    at: int

    def merges_nothing(self, rg: RuntimeGraph) -> bool:
        """Whether a walk of ``rg`` as it is now would merge nothing (False: it might)."""
        touched = rg.touched[self.at :]
        if EVERY_NODE in touched:
            return False
        first, by_attrs = self.seen.first, self.seen.by_attrs
        edited = set(touched)
        nodes = rg.nodes
        among: dict[tuple, RuntimeNode] = {}  # the touched nodes' keys, with attributes
        for i in dict.fromkeys(touched):
            node = nodes[i]
            if node is None or not _mergeable(rg, node):
                continue
            key = (node.domain, node.op, tuple(node.inputs), len(node.outputs))
            attrs = _attr_key(node.attrs)
            if among.setdefault(key + (attrs,), node) is not node:
                return False
            # the untouched node the walk saw with this key and these attributes, if any (where
            # that node was touched since, no untouched node has them: they were unique)
            seen = first.get(key)
            if seen is not None:
                groups = by_attrs.get(key)
                if groups is not None:
                    seen = groups.get(attrs)
                elif _attr_key(seen.attrs) != attrs:
                    seen = None
            if seen is not None and seen is not node and seen.index not in edited:
                return False
        return True


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
        kept = rg.kept.get(self.name)
        if isinstance(kept, _Unchanged) and kept.merges_nothing(rg):
            return False
        at = len(rg.touched)
        changed, seen = _cse(rg)
        if len(rg.touched) == at:  # no edit at all (a merge stopped by an output rewires some readers)
            rg.kept[self.name] = _Unchanged(seen, at)
        else:
            rg.kept.pop(self.name, None)
        return changed
