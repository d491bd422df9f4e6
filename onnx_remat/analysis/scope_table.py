"""The data behind ``onnx-remat scopes``: per scope, its nodes, stashed bytes and what recompute releases.

For every scope of the tree: the forward nodes it holds (with its children), the bytes of the
activations it stashes for the backward pass (where shapes are known; unknown ones are counted,
never taken as zero), the stored bytes that recomputing it as one segment would release, and
which scopes are repeated layers (``blocks.0`` .. ``blocks.9``, 10 x ``Block``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from onnx_remat.analysis.model import ModelAnalysis
from onnx_remat.analysis.scopes import Scope
from onnx_remat.remat.plan import planner_of


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
    # what to give --scope: [{"pattern", "scopes", "count", "class"}], the best first (suggestions())
    suggestions: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "scope_source": self.source,
            "total_stashed_bytes": self.total_stashed_bytes,
            "unknown_symbols": self.unknown_symbols,
            "repeated_layers": self.repeated_groups,
            "suggestions": self.suggestions,
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
    for group in _regroup_containers(tree.repeated_layers()):
        kind = group[0].short_class or "same structure"
        for i, s in enumerate(group):
            repeated[id(s)] = f"{i + 1} of {len(group)} x {kind}"
        groups.append({"scopes": [s.path for s in group], "class": group[0].class_name, "count": len(group)})

    planner = planner_of(analysis, dropout)
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
        suggestions=suggestions(tree),
    )


def _is_library_class(class_name: str | None) -> bool:
    """torch.nn's own modules: layers (Linear, Conv2d, BatchNorm2d) and containers (Sequential,
    ModuleList). A user's block is the class of their own that repeats."""
    return bool(class_name) and str(class_name).startswith("torch.nn.")


def _structure(scope: Scope) -> tuple:
    return tuple(n.op for n in scope.all_nodes())


def _regroup_containers(groups: list[list[Scope]]) -> list[list[Scope]]:
    """Sibling groups, with torch.nn containers (four ``Sequential``: a stem and three stages) grouped
    by structure instead of class: being a Sequential does not make them the same layer."""
    out: list[list[Scope]] = []
    for group in groups:
        if not group[0].class_name or not str(group[0].class_name).startswith("torch.nn.modules.container."):
            out.append(group)
            continue
        by_ops: dict[tuple, list[Scope]] = {}
        for sc in group:
            by_ops.setdefault(_structure(sc), []).append(sc)
        out.extend(g for g in by_ops.values() if len(g) > 1)
    return out


def suggestions(tree) -> list[dict[str, Any]]:
    """What to give ``--scope`` for per-block recompute, best first.

    With class names: every class of the user's own (not torch.nn's) with two or more
    instances anywhere in the tree (nested instances folded into the outer one), the
    outermost first, then the most instances: resnet's ``BasicBlock`` (6, inside
    ``Sequential`` stages), not the ``Sequential`` stages. Without class names: sibling
    scopes of the same structure under one parent, as a glob (``encoder.layer.*``).
    """
    by_class: dict[str, list[Scope]] = {}
    for sc in tree.root.walk():
        if sc is tree.root or not sc.class_name or _is_library_class(sc.class_name):
            continue
        by_class.setdefault(sc.class_name, []).append(sc)
    ranked = []
    for cls, scopes in by_class.items():
        outer = [sc for sc in scopes if not any(a.class_name == cls for a in sc.ancestors() if a is not tree.root)]
        if len(outer) < 2:
            continue
        depth = min(sc.path.count(".") for sc in outer)
        short = cls.rsplit(".", 1)[-1]
        ranked.append((depth, -len(outer), short, [sc.path for sc in outer], cls))
    ranked.sort(key=lambda r: (r[0], r[1], r[2]))
    out: list[dict[str, Any]] = [
        {"pattern": short, "scopes": paths, "count": len(paths), "class": cls} for _, _, short, paths, cls in ranked
    ]
    if out:
        return out
    for group in tree.repeated_layers():
        if group[0].class_name or len(group) < 2:
            continue
        parents = {sc.path.rpartition(".")[0] for sc in group}
        if len(parents) == 1:
            parent = parents.pop()
            pattern = f"{parent}.*" if parent else "*"
            out.append({"pattern": pattern, "scopes": [sc.path for sc in group], "count": len(group), "class": None})
    out.sort(key=lambda g: -g["count"])
    return out
