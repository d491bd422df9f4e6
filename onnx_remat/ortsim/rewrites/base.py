"""The two kinds of onnxruntime graph rewrite the emulation has, as small units.

* :class:`NodeRule` is one of onnxruntime's ``RewriteRule``s: it looks at one node of the op types
  in ``ops`` and may rewrite around it. A :class:`RuleBasedTransformer` walks the graph in its
  current DEFAULT order and gives each node to the first of its rules that rewrites it, as
  onnxruntime's ``RuleBasedGraphTransformer`` does.
* :class:`GraphPass` is a whole-graph ``GraphTransformer``; it is skipped when none of the op
  types in ``ops`` (if given) occurs in the graph, since it would change nothing.

Each returns whether it changed the graph; :func:`onnx_remat.ortsim.optimizer.optimize` runs them
level by level until nothing changes. ``rg.rewrites`` counts what each unit did, by name.
"""

from __future__ import annotations

from collections.abc import Sequence

from onnx_remat.ortsim.graph import RuntimeGraph, RuntimeNode


class NodeRule:
    """A rewrite around one node (onnxruntime's ``RewriteRule``)."""

    name: str = ""
    ops: frozenset[tuple[str, str]] = frozenset()

    def apply(self, rg: RuntimeGraph, node: RuntimeNode) -> bool:
        raise NotImplementedError


class GraphPass:
    """A rewrite of the whole graph (onnxruntime's ``GraphTransformer``)."""

    name: str = ""
    ops: tuple[tuple[str, str], ...] | None = None  # skipped unless one of these op types occurs

    def applies(self, rg: RuntimeGraph) -> bool:
        return self.ops is None or rg.has_op(*self.ops)

    def apply(self, rg: RuntimeGraph) -> bool:
        raise NotImplementedError


class RuleBasedTransformer(GraphPass):
    """Runs node rules over the graph in its current DEFAULT order (``RuleBasedGraphTransformer``)."""

    def __init__(self, name: str, rules: Sequence[NodeRule]) -> None:
        self.name = name
        self.rules = list(rules)
        self.ops = tuple(sorted({key for r in self.rules for key in r.ops}))
        # The rules of each op type, in their order: most nodes have none.
        self.rules_of: dict[tuple[str, str], list[NodeRule]] = {
            key: [r for r in self.rules if key in r.ops] for key in self.ops
        }
        # The op types (without domain) some rule looks at: the walk tests a node's op against this
        # set before it builds its (domain, op) key, since most nodes have no rule.
        self.op_names = frozenset(op for _, op in self.ops)

    def apply(self, rg: RuntimeGraph) -> bool:
        changed = False
        rules_of, op_names = self.rules_of, self.op_names
        nodes = rg.nodes
        for i in rg.default_order():
            node = nodes[i]
            if node is None or node.op not in op_names:
                continue
            for rule in rules_of.get((node.domain, node.op), ()):
                if rule.apply(rg, node):
                    changed = True
                    break  # the node may be gone; the next walk sees what the rule made
        return changed
