"""Pictures of a training graph and of what the recompute rewrite changes in it.

>>> from onnx_remat.show.graph_view import graph_view, write_graph
>>> view = graph_view("models/artifacts/blocks10", scopes=["Block"], expand=2)   # the rewritten graph
>>> write_graph(view, "blocks10_after.svg")                                     # .dot, .svg, .png, .html

Input: a training graph and, optionally, a selection to recompute (``scopes`` etc., as
:func:`onnx_remat.remat.apply` takes them). Output: a :class:`GraphView` (what to draw, already reduced
to a size Graphviz can lay out) and its DOT text (:func:`to_dot`), rendered by Graphviz's ``dot``.

What is drawn:

* node colours: forward (blue), backward (orange), clones (green), barriers (purple);
* one cluster per *expanded* scope instance, holding its forward nodes, its backward nodes (those
  onnxruntime's gradient builder made for them, named ``<forward node>_Grad/...``) and, after the
  rewrite, its clones and barrier;
* edges that the rewrite changed in bold: green for a backward reader now reading a clone, purple
  for what goes through a barrier; with ``before=True`` the original graph is drawn and the
  edges the rewrite will replace (stored activation -> backward reader) are red;
* everything else collapsed, one box per scope instance with its node counts and the bytes of
  activations it stores for the backward pass, runs of more than ``max_run`` collapsed instances
  of the same class merged into one box, plus boxes for the loss and other unscoped nodes and the
  gradient accumulators. The view says what it collapsed (:attr:`GraphView.collapsed`).

Real training graphs have 10^4-10^5 nodes; the reduction is linear and the DOT output stays
bounded by the expanded scopes (``expand`` instances, default 2) plus a few boxes.
"""

from __future__ import annotations

import html
import os
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from onnx_remat.analysis.model import ModelAnalysis, ModelLike, analyze_model
from onnx_remat.analysis.scopes import Scope, natural_key
from onnx_remat.errors import RematError
from onnx_remat.graph import tags
from onnx_remat.graph.conventions import (
    ACCUMULATOR_OPS,
    ACCUMULATOR_PREFIX,
    forward_node_of_gradient,
    summed_tensor,
)
from onnx_remat.model_io import write_file
from onnx_remat.units import format_bytes

if TYPE_CHECKING:
    from onnx_remat.remat.result import ApplyResult

FORMATS = (".dot", ".svg", ".png", ".html")
COLORS = {
    "forward": ("#cfe2f3", "#3d6fa8"),
    "backward": ("#fce5cd", "#c27b2b"),
    "clone": ("#d9ead3", "#2f8a3b"),
    "barrier": ("#e4d1ee", "#7b3fa0"),
    "collapsed": ("#f3f3f3", "#888888"),
}
EDGE_REWIRED = "#2f8a3b"
EDGE_BARRIER = "#7b3fa0"
EDGE_REPLACED = "#cc2222"
INSTALL_HINT = (
    "install Graphviz (Debian/Ubuntu: apt-get install graphviz; macOS: brew install graphviz; "
    "conda: conda install graphviz)"
)


@dataclass
class ViewNode:
    id: str
    label: str
    kind: str  # forward, backward, clone, barrier, collapsed
    unit: str  # the cluster / box it belongs to
    tooltip: str = ""


@dataclass
class ViewEdge:
    src: str
    dst: str
    label: str = ""
    style: str = ""  # "", rewired, barrier, replaced, stored
    count: int = 1


@dataclass
class GraphView:
    """What to draw. ``clusters`` maps an expanded unit to its title; ``collapsed`` says what was folded."""

    title: str
    nodes: list[ViewNode]
    edges: list[ViewEdge]
    clusters: dict[str, str]
    collapsed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rewritten: bool = False

    def summary(self) -> str:
        return "; ".join(self.collapsed) if self.collapsed else "nothing collapsed"


# -- assigning nodes to units ----------------------------------------------------------------


def _unit_paths(analysis: ModelAnalysis, expanded_scopes: list[Scope]) -> tuple[dict[int, str], dict[str, Scope]]:
    """Unit path of every forward node: its expanded scope instance, else its top-level scope."""
    expanded = {id(s): s for s in expanded_scopes}
    unit_of: dict[int, str] = {}
    top_scope: dict[str, Scope] = {}
    for node in analysis.graph.forward_nodes:
        scope = analysis.scopes.scope_of(node)
        chosen = None
        s = scope
        top = None
        while s is not None and s.path:
            if id(s) in expanded:
                chosen = s
            top = s
            s = s.parent
        unit = chosen or top
        if unit is None:
            unit_of[id(node)] = "(no scope)"
        else:
            unit_of[id(node)] = unit.path
            top_scope[unit.path] = unit
    return unit_of, top_scope


def graph_view(
    model: ModelLike | ModelAnalysis | ApplyResult,
    *,
    scopes: str | Iterable[str] | None = None,
    op_types: str | Iterable[str] | None = None,
    nodes: str | Iterable[str] | None = None,
    recompute_outputs: bool = False,
    focus: str | Iterable[str] | None = None,
    expand: int = 2,
    before: bool = False,
    max_run: int = 3,
    dims: dict[str, int] | None = None,
) -> GraphView:
    """Build the view of ``model`` (see the module docstring).

    ``model``: a model, its :class:`ModelAnalysis`, or an :class:`~onnx_remat.ApplyResult` (its
    rewrite is drawn; the selection keywords are then not used). With a selection the rewritten
    graph is drawn (the original with ``before=True``). ``focus``: scope patterns to expand
    (default: the first ``expand`` recomputed scope instances, or the first ``expand`` top-level
    scopes without a selection). Raises :class:`RematError` for patterns that match nothing.
    """
    from onnx_remat.remat.apply import apply, as_list
    from onnx_remat.remat.result import ApplyResult

    applied: ApplyResult | None = None
    if isinstance(model, ApplyResult):
        applied = model
        analysis = applied.analysis
    else:
        analysis = model if isinstance(model, ModelAnalysis) else analyze_model(model, dims=dims)
        if as_list(scopes) or as_list(op_types) or as_list(nodes):
            applied = apply(
                analysis, scopes=scopes, op_types=op_types, nodes=nodes, recompute_outputs=recompute_outputs
            )
    return _build(
        analysis, applied, _expanded(analysis, applied, as_list(focus), expand), before=before, max_run=max_run
    )


def _expanded(analysis: ModelAnalysis, applied: ApplyResult | None, focus: list[str], expand: int) -> list[Scope]:
    """The scope instances drawn in full: ``focus``, else the first recomputed ones, else the first
    top-level ones."""
    tree = analysis.scopes
    count = max(expand, 0)
    if focus:
        return tree.match(focus).scopes
    if applied is None:
        return tree.root.children[:count]
    paths = sorted({p for s in applied.rewrite.segments for p in s.segment.scopes}, key=natural_key)
    if paths:
        return tree.match(paths[:count]).scopes
    # op / node selections: the top-level scopes holding the first segments' nodes
    found: list[Scope] = []
    for seg in applied.plan.segments:
        for n in seg.recompute:
            s = tree.scope_of(n)
            while s is not None and s.parent is not None and s.parent.path:
                s = s.parent
            if s is not None and s.path and s not in found:
                found.append(s)
    return found[:count] or tree.root.children[:count]


def _served_node(proto, consumer_name: dict[str, str]) -> str:
    """For a fence, a random-order pin or a mask-packing node the rewrite added: the forward node
    it feeds (for packing, the Dropout whose mask it packs)."""
    name = proto.name
    if tags.is_pack_name(name):
        return _source_of(proto)
    if tags.is_fence_name(name) and proto.output:
        name = consumer_name.get(proto.output[0], "")
    if tags.is_pin_name(name):
        return name[len(tags.PIN_PREFIX) :]
    return name


def _source_of(proto) -> str:
    """The ``onnx_remat.source`` metadata of a node the rewrite added (the node it serves)."""
    return next((p.value for p in proto.metadata_props if p.key == tags.SOURCE_KEY), "")


@dataclass
class _Drawing:
    """The graph being drawn, node by node: its protos, each one's kind and unit, and the boxes."""

    analysis: ModelAnalysis
    protos: list
    kinds: list[str]
    units: list[str]
    producer: dict[str, int]
    unit_scope: dict[str, Scope]
    expanded_paths: set[str]
    fwd_unit_by_name: dict[str, str]
    box_of: dict[str, str] = field(default_factory=dict)

    def cls(self, unit: str) -> str | None:
        s = self.unit_scope.get(unit)
        return s.short_class if s is not None else None


def _build(
    analysis: ModelAnalysis, applied: ApplyResult | None, expanded: list[Scope], *, before: bool, max_run: int
) -> GraphView:
    rewritten = applied is not None and not before
    model = applied.model if applied is not None and rewritten else analysis.model
    d = _units(analysis, list(model.graph.node), expanded)
    collapsed = _collapse(d, max_run)
    nodes, node_id = _view_nodes(d)
    edges = _edges(d, node_id, applied, before)
    clusters = {s.path: s.path + (f" ({s.short_class})" if s.short_class else "") for s in expanded}
    notes = []
    title = f"{analysis.name}: " + ("after" if rewritten else ("before" if applied is not None else "training graph"))
    if applied is not None:
        segs = applied.rewrite.segments
        notes.append(
            f"{applied.clone_count} nodes cloned in {len(segs)} segments"
            + ("" if rewritten else " (drawn before the rewrite: red edges are the ones it replaces)")
        )
        title += " recompute of " + ", ".join(
            sorted({p for s in segs for p in s.segment.scopes}, key=natural_key)[:3] or [s.label for s in segs[:3]]
        )
        if len(segs) > 3:
            title += " …"
    return GraphView(
        title=title, nodes=nodes, edges=edges, clusters=clusters, collapsed=collapsed, notes=notes, rewritten=rewritten
    )


def _kind(name: str, backward_names: set[str]) -> str:
    if tags.is_barrier_name(name):
        return "barrier"
    if tags.is_clone_name(name) or tags.is_unpack_name(name):
        return "clone"  # unpacking a dropout mask is part of the segment's recompute
    return "backward" if name in backward_names else "forward"


def _units(analysis: ModelAnalysis, protos: list, expanded: list[Scope]) -> _Drawing:
    """Each node's kind (forward, backward, clone, barrier) and unit: the drawn scope it belongs to,
    or a group such as "(gradient accumulation)". Gradient nodes go with the forward node they
    differentiate, clones with their original, barriers with their segment."""
    tg = analysis.graph
    unit_of_fwd, unit_scope = _unit_paths(analysis, expanded)
    producer = {o: i for i, p in enumerate(protos) for o in p.output if o}
    fwd_unit_by_name = {n.name: unit_of_fwd[id(n)] for n in tg.forward_nodes if n.name}
    backward_names = {n.name for n in tg.backward_nodes}
    kinds = [_kind(p.name, backward_names) for p in protos]
    expanded_paths = {s.path for s in expanded}
    consumer_name: dict[str, str] = {}
    for p in protos:
        for t in p.input:
            consumer_name.setdefault(t, p.name)
    units: list[str] = []
    for p, k in zip(protos, kinds):
        name = p.name
        unit = None
        summed = summed_tensor(name)
        if k == "forward":
            unit = fwd_unit_by_name.get(name) or fwd_unit_by_name.get(_served_node(p, consumer_name))
        elif k == "clone":
            origin = _source_of(p) if tags.is_unpack_name(name) else tags.original_name(name)
            unit = fwd_unit_by_name.get(origin)
        elif k == "barrier":
            label = tags.segment_of_name(name) or ""
            unit = label if label in unit_scope or label in expanded_paths else None
        elif forward_node_of_gradient(name) is not None:
            unit = fwd_unit_by_name.get(forward_node_of_gradient(name) or "")
        elif summed is not None:
            prod = producer.get(summed)
            unit = units[prod] if prod is not None and prod < len(units) else None
            if unit is None:
                n = tg.tensors.get(summed)
                if n is not None and n.inputs:
                    unit = fwd_unit_by_name.get(n.inputs[0].name)
        elif name.startswith(ACCUMULATOR_PREFIX) or p.op_type in ACCUMULATOR_OPS:
            unit = "(gradient accumulation)"
        if unit is None:
            unit = "(loss and other backward)" if k != "forward" else "(no scope)"
        units.append(unit)
    # Barriers whose segment label is no unit (op/node selections, nested scopes): their clones' unit.
    clone_reader_unit: dict[str, str] = {}
    for q, k, u in zip(protos, kinds, units):
        if k == "clone":
            for t in q.input:
                clone_reader_unit.setdefault(t, u)
    for i, p in enumerate(protos):
        if kinds[i] == "barrier" and units[i].startswith("("):
            found = next((clone_reader_unit[o] for o in p.output if o in clone_reader_unit), None)
            if found is not None:
                units[i] = found
    return _Drawing(analysis, protos, kinds, units, producer, unit_scope, expanded_paths, fwd_unit_by_name)


def _collapse(d: _Drawing, max_run: int) -> list[str]:
    """Fill ``d.box_of``: runs of more than ``max_run`` collapsed scopes of one class become one
    box; returns what was collapsed, in words."""
    order: list[str] = []
    seen: set[str] = set()
    for kind, unit in zip(d.kinds, d.units):
        if kind == "forward" and unit not in seen:
            seen.add(unit)
            order.append(unit)
    order += [u for u in dict.fromkeys(d.units) if u not in seen]
    notes: list[str] = []
    run: list[str] = []

    def flush() -> None:
        if len(run) > max_run:
            box = f"{run[0]} … {run[-1]}"
            d.box_of.update((u, box) for u in run)
            notes.append(f"{len(run)} scopes {run[0]} … {run[-1]} ({d.cls(run[0]) or 'same class'}) into one box")
        else:
            d.box_of.update((u, u) for u in run)
            notes.extend(f"scope {u}" for u in run)
        run.clear()

    for u in order:
        if u in d.expanded_paths:
            flush()
        elif u.startswith("("):
            flush()
            d.box_of[u] = u
            notes.append(u.strip("()"))
        else:
            if run and d.cls(run[-1]) != d.cls(u):
                flush()
            run.append(u)
    flush()
    return notes


def _view_nodes(d: _Drawing) -> tuple[list[ViewNode], dict[int, str]]:
    """The drawn items (nodes of expanded scopes, one box per collapsed unit group) and, per
    proto, the id of the item it is drawn in."""
    tg, sizes = d.analysis.graph, d.analysis.sizes
    stats: dict[str, dict[str, int]] = {}
    stored_by_unit: dict[str, int] = {}
    for t in tg.stashed:
        prod = t.inputs[0] if t.inputs else None
        u = d.fwd_unit_by_name.get(prod.name) if prod is not None else None
        if u is not None:
            stored_by_unit[u] = stored_by_unit.get(u, 0) + (sizes.nbytes(t.name) or 0)
    for kind, u in zip(d.kinds, d.units):
        if u in d.expanded_paths:
            continue
        box = d.box_of.get(u, u)
        st = stats.setdefault(box, {"forward": 0, "backward": 0, "clone": 0, "barrier": 0, "stored": 0, "units": 0})
        st[kind] += 1
    for u, box in d.box_of.items():
        if box in stats:
            stats[box]["stored"] += stored_by_unit.get(u, 0)
            stats[box]["units"] += 1
    nodes: list[ViewNode] = []
    node_id: dict[int, str] = {}
    for i, p in enumerate(d.protos):
        u = d.units[i]
        if u in d.expanded_paths:
            node_id[i] = f"n{i}"
            short = p.name.rsplit("/", 2)
            short_name = "/".join(short[-2:]) if len(short) > 1 else p.name
            label = p.op_type if d.kinds[i] != "barrier" else "PassThrough\n(barrier)"
            nodes.append(ViewNode(f"n{i}", f"{label}\n{_ellipsis(short_name, 28)}", d.kinds[i], u, p.name))
        else:
            node_id[i] = "box:" + d.box_of.get(u, u)
    for box, st in stats.items():
        parts = [
            f"{st[k]} {word}"
            for k, word in (
                ("forward", "forward"),
                ("backward", "backward"),
                ("clone", "clones"),
                ("barrier", "barriers"),
            )
            if st[k]
        ]
        counts = " + ".join(parts) + " nodes"
        stored = f"\nstores {format_bytes(st['stored'])}" if st["stored"] else ""
        title = box.strip("()") if box.startswith("(") else box
        cl = None if box.startswith("(") else d.cls(box.split(" … ")[0])
        head = f"{title}" + (f" ({st['units']} × {cl})" if st["units"] > 1 and cl else (f" ({cl})" if cl else ""))
        nodes.append(ViewNode("box:" + box, f"{head}\n{counts}{stored}", "collapsed", box))
    return nodes, node_id


def _edges(d: _Drawing, node_id: dict[int, str], applied: ApplyResult | None, before: bool) -> list[ViewEdge]:
    """Tensor edges between drawn items, one per (source, destination, style)."""
    stashed = {t.name for t in d.analysis.graph.stashed}
    target_names = {t.name for seg in applied.plan.segments for t in seg.targets} if applied is not None else set()
    kinds = d.kinds
    edges: dict[tuple[str, str, str], ViewEdge] = {}
    for j, p in enumerate(d.protos):
        dst = node_id[j]
        for t in p.input:
            if not t or t not in d.producer:
                continue
            i = d.producer[t]
            src = node_id[i]
            if src == dst:
                continue
            style = ""
            if kinds[i] == "clone" and kinds[j] not in ("clone", "barrier"):
                style = "rewired"
            elif kinds[i] == "barrier" or kinds[j] == "barrier":
                style = "barrier"
            elif before and t in target_names and kinds[j] == "backward":
                style = "replaced"
            elif t in stashed and kinds[j] == "backward" and kinds[i] == "forward":
                style = "stored"
            both_boxes = src.startswith("box:") and dst.startswith("box:")
            key = (src, dst, style if not both_boxes else "")
            e = edges.get(key)
            if e is None:
                nb = d.analysis.sizes.nbytes(t)
                label = format_bytes(nb) if (nb and nb >= 1 << 20 and not both_boxes) else ""
                edges[key] = ViewEdge(src, dst, label, style if not both_boxes else "")
            else:
                e.count += 1
    return list(edges.values())


def _ellipsis(text: str, n: int) -> str:
    return text if len(text) <= n else "…" + text[-(n - 1) :]


# -- DOT ------------------------------------------------------------------------------------


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(view: GraphView) -> str:
    """The view as Graphviz DOT text."""
    lines = [
        "digraph remat {",
        f"  graph [label={_q(view.title)}, labelloc=t, fontsize=16, fontname=Helvetica, rankdir=TB, "
        "newrank=true, nodesep=0.25, ranksep=0.35];",
        '  node [shape=box, style="rounded,filled", fontname=Helvetica, fontsize=10, height=0.3];',
        '  edge [fontname=Helvetica, fontsize=8, color="#777777", arrowsize=0.6];',
    ]
    by_unit: dict[str, list[ViewNode]] = {}
    for n in view.nodes:
        by_unit.setdefault(n.unit if n.kind != "collapsed" else "", []).append(n)

    def node_line(n: ViewNode, indent: str) -> str:
        fill, line = COLORS[n.kind]
        extra = ", shape=box3d" if n.kind == "collapsed" else ""
        extra += ", penwidth=2" if n.kind in ("clone", "barrier") else ""
        tooltip = f", tooltip={_q(n.tooltip)}" if n.tooltip else ""
        return f"{indent}{_q(n.id)} [label={_q(n.label)}, fillcolor={_q(fill)}, color={_q(line)}{extra}{tooltip}];"

    for k, (unit, title) in enumerate(view.clusters.items()):
        members = by_unit.get(unit, [])
        if not members:
            continue
        lines.append(f"  subgraph cluster_{k} {{")
        lines.append(f'    label={_q(title)}; style="rounded,dashed"; color="#999999"; fontsize=12;')
        groups: dict[str, list[ViewNode]] = {"forward": [], "backward": [], "recompute": []}
        for n in members:
            groups["recompute" if n.kind in ("clone", "barrier") else n.kind].append(n)
        for g, (label, color) in {
            "forward": ("forward", "#3d6fa8"),
            "backward": ("backward", "#c27b2b"),
            "recompute": ("recompute", "#2f8a3b"),
        }.items():
            if not groups[g]:
                continue
            lines.append(f"    subgraph cluster_{k}_{g} {{")
            lines.append(f"      label={_q(label)}; style=rounded; color={_q(color)}; fontsize=10;")
            for n in groups[g]:
                lines.append(node_line(n, "      "))
            lines.append("    }")
        lines.append("  }")
    for n in by_unit.get("", []):
        lines.append(node_line(n, "  "))
    for e in view.edges:
        attrs = []
        if e.label:
            attrs.append(f"label={_q(e.label)}")
        if e.style == "rewired":
            attrs.append(f"color={_q(EDGE_REWIRED)}, penwidth=2.4")
        elif e.style == "barrier":
            attrs.append(f"color={_q(EDGE_BARRIER)}, penwidth=2")
        elif e.style == "replaced":
            attrs.append(f"color={_q(EDGE_REPLACED)}, penwidth=2.4")
        elif e.style == "stored":
            attrs.append("style=dashed, constraint=false")
        if e.src.startswith("box:") or e.dst.startswith("box:"):
            attrs.append("weight=0")
        if e.count > 1 and not e.label:
            attrs.append(f"taillabel={_q('×' + str(e.count))}")
        lines.append(f"  {_q(e.src)} -> {_q(e.dst)}" + (f" [{', '.join(attrs)}]" if attrs else "") + ";")
    swatches = "".join(
        f'<td bgcolor="{COLORS[k][0]}" color="{COLORS[k][1]}">{label}</td>'
        for k, label in (
            ("forward", "forward"),
            ("backward", "backward"),
            ("clone", "clone (recompute)"),
            ("barrier", "barrier"),
            ("collapsed", "collapsed scopes"),
        )
    )
    edge_keys = (
        f'<font color="{EDGE_REWIRED}"><b>&#8594;</b> backward reader now reads a clone</font>   '
        f'<font color="{EDGE_BARRIER}"><b>&#8594;</b> through a barrier</font>   '
        f'<font color="{EDGE_REPLACED}"><b>&#8594;</b> edge the rewrite replaces</font>   '
        "- - &#8594; activation stored for the backward pass"
    )
    lines.append(
        '  legend [shape=plaintext, style="", fontsize=9, label=<<table border="0" cellborder="1" cellspacing="2" '
        f'cellpadding="3"><tr>{swatches}</tr><tr><td colspan="5" border="0">{edge_keys}</td></tr></table>>];'
    )
    lines.append("}")
    return "\n".join(lines) + "\n"


# -- rendering ------------------------------------------------------------------------------


def graphviz_available() -> bool:
    return shutil.which("dot") is not None


def render(dot_text: str, fmt: str, *, timeout: float = 120.0, dpi: int = 80) -> bytes:
    """Run Graphviz's ``dot -T<fmt>``. Raises :class:`RematError` (with how to install it) when missing."""
    exe = shutil.which("dot")
    if exe is None:
        raise RematError(
            f"rendering {fmt.upper()} needs Graphviz's `dot`, which is not on PATH: {INSTALL_HINT}; "
            "or write a .dot file"
        )
    try:
        args = [exe, f"-T{fmt}"] + ([f"-Gdpi={dpi}"] if fmt == "png" else [])
        proc = subprocess.run(args, input=dot_text.encode(), capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RematError(f"Graphviz took more than {timeout:.0f} s to lay the graph out: expand fewer scopes") from None
    if proc.returncode != 0:
        first = proc.stderr.decode(errors="replace").strip().splitlines()
        raise RematError(f"Graphviz failed: {first[0] if first else 'exit status ' + str(proc.returncode)}")
    return proc.stdout


def html_page(view: GraphView, svg: str | None, dot_text: str) -> str:
    """A self-contained HTML page with the SVG (or, without Graphviz, the DOT text and a note)."""
    body = (
        svg
        if svg is not None
        else (
            "<p class=note>Graphviz (<code>dot</code>) is not installed, so this page holds the DOT text; "
            f"{html.escape(INSTALL_HINT)} and render it with <code>dot -Tsvg</code>.</p>"
            f"<pre>{html.escape(dot_text)}</pre>"
        )
    )
    collapsed = "".join(f"<li>{html.escape(c)}</li>" for c in view.collapsed)
    notes = "".join(f"<li>{html.escape(c)}</li>" for c in view.notes)
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        f"<title>{html.escape(view.title)}</title>"
        "<style>body{font-family:Helvetica,Arial,sans-serif;margin:1.5em;color:#222}"
        ".graph svg{max-width:100%;height:auto}.note{color:#8a4b00}pre{background:#f6f6f6;padding:1em;overflow:auto}"
        "</style></head><body>"
        f"<h1 style='font-size:1.3em'>{html.escape(view.title)}</h1>"
        f"<div class=graph>{body}</div>"
        + (f"<h2 style='font-size:1.1em'>Notes</h2><ul>{notes}</ul>" if notes else "")
        + (f"<h2 style='font-size:1.1em'>Collapsed</h2><ul>{collapsed}</ul>" if collapsed else "")
        + "</body></html>\n"
    )


def write_graph(view: GraphView, path: str | os.PathLike, *, force: bool = False) -> Path:
    """Write ``view`` as ``.dot`` (always possible), ``.svg`` / ``.png`` (Graphviz) or ``.html``
    (the SVG in a self-contained page; without Graphviz, the DOT text with a note). Returns the path.
    Written atomically; an existing file is replaced only with ``force``."""
    out = Path(path)
    suffix = out.suffix.lower()
    if suffix not in FORMATS:
        raise RematError(
            f"{out}: cannot write a {suffix or 'suffix-less'} graph; give a .dot, .svg, .png or .html path"
        )
    dot_text = to_dot(view)
    if suffix == ".dot":
        data = dot_text.encode()
    elif suffix in (".svg", ".png"):
        data = render(dot_text, suffix[1:])
    else:
        svg = None
        if graphviz_available():
            svg = render(dot_text, "svg").decode()
            svg = svg[svg.index("<svg") :] if "<svg" in svg else svg
        data = html_page(view, svg, dot_text).encode()
    write_file(out, data, force=force)
    return out
