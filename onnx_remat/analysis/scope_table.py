"""The data behind ``onnx-remat scopes``: per scope, its nodes, stashed bytes and what recompute releases.

For every scope of the tree: the forward nodes it holds (with its children), the bytes of the
activations it stashes for the backward pass (where shapes are known; unknown ones are counted,
never taken as zero), the stored bytes that recomputing it as one segment would release, and
which scopes are repeated layers (``blocks.0`` .. ``blocks.9``, 10 x ``Block``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from onnx_remat.analysis.model import ModelAnalysis
from onnx_remat.analysis.scopes import Scope
from onnx_remat.remat.plan import Planner


@dataclass
class ScopeRow:
    path: str
    class_name: str | None
    depth: int
    nodes: int
    stashed_bytes: int
    stashed_unknown: int  # stashed tensors of unknown size (not in stashed_bytes)
    releasable_bytes: int  # counting tensors of known size
    releasable_unknown: int  # tensors of unknown size a recompute would release or keep
    repeated: str | None  # e.g. "1 of 10 x Block"

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "class": self.class_name,
            "depth": self.depth,
            "forward_nodes": self.nodes,
            "stashed_bytes": self.stashed_bytes,
            "stashed_unknown_tensors": self.stashed_unknown,
            "releasable_bytes": self.releasable_bytes,
            "releasable_unknown_tensors": self.releasable_unknown,
            "repeated": self.repeated,
        }


@dataclass
class ScopeReport:
    model: str
    source: str
    rows: list[ScopeRow]
    repeated_groups: list[dict] = field(default_factory=list)
    total_stashed_bytes: int = 0
    unknown_symbols: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "scope_source": self.source,
            "total_stashed_bytes": self.total_stashed_bytes,
            "unknown_symbols": self.unknown_symbols,
            "repeated_layers": self.repeated_groups,
            "scopes": [r.to_json() for r in self.rows],
        }


def scope_report(analysis: ModelAnalysis, *, max_depth: int | None = None, dropout: str = "packed") -> ScopeReport:
    """Build the scope table of ``analysis`` (rows in tree order, down to ``max_depth``); what a
    recompute releases counts dropout masks as ``dropout`` keeps them (see :func:`onnx_remat.apply`)."""
    tg, tree, sizes = analysis.graph, analysis.scopes, analysis.sizes
    direct_bytes: dict[int, int] = {}
    direct_unknown: dict[int, int] = {}
    for t in tg.stashed:
        scope = tree.scope_of(t.inputs[0])
        if scope is None:
            continue
        b = sizes.nbytes(t.name)
        if b is None:
            direct_unknown[id(scope)] = direct_unknown.get(id(scope), 0) + 1
        else:
            direct_bytes[id(scope)] = direct_bytes.get(id(scope), 0) + b

    # Subtree sums, children before parents (reverse pre-order), without recursion.
    order = list(tree.root.walk())
    total_bytes = dict(direct_bytes)
    total_unknown = dict(direct_unknown)
    total_nodes = {id(s): len(s.nodes) for s in order}
    for scope in reversed(order):
        if scope.parent is not None:
            p = id(scope.parent)
            total_bytes[p] = total_bytes.get(p, 0) + total_bytes.get(id(scope), 0)
            total_unknown[p] = total_unknown.get(p, 0) + total_unknown.get(id(scope), 0)
            total_nodes[p] += total_nodes[id(scope)]

    repeated: dict[int, str] = {}
    groups = []
    for group in tree.repeated_layers():
        kind = group[0].short_class or "same structure"
        for i, s in enumerate(group):
            repeated[id(s)] = f"{i + 1} of {len(group)} x {kind}"
        groups.append({"scopes": [s.path for s in group], "class": group[0].class_name, "count": len(group)})

    planner = Planner(tg, tree, sizes, dropout=dropout)
    rows: list[ScopeRow] = []
    stack: list[tuple[Scope, int]] = [(c, 0) for c in reversed(tree.root.children)]
    while stack:
        scope, depth = stack.pop()
        seg = planner.scope_segment(scope)
        rows.append(
            ScopeRow(
                path=scope.path,
                class_name=scope.class_name,
                depth=depth,
                nodes=total_nodes[id(scope)],
                stashed_bytes=total_bytes.get(id(scope), 0),
                stashed_unknown=total_unknown.get(id(scope), 0),
                releasable_bytes=seg.released_bytes if seg else 0,
                releasable_unknown=len(seg.unknown_sizes) if seg else 0,
                repeated=repeated.get(id(scope)),
            )
        )
        if max_depth is None or depth + 1 <= max_depth:
            stack.extend((c, depth + 1) for c in reversed(scope.children))
    symbols = sorted(sizes.unbound_symbols(t.name for t in tg.stashed))
    return ScopeReport(
        model=analysis.name,
        source=tree.source,
        rows=rows,
        repeated_groups=groups,
        total_stashed_bytes=total_bytes.get(id(tree.root), 0),
        unknown_symbols=symbols,
    )
