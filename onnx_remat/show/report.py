"""One self-contained HTML page about a recompute rewrite: the numbers, the timeline, the scopes, the graph.

>>> import onnx_remat
>>> from onnx_remat.show.report import write_report
>>> result = onnx_remat.apply("models/artifacts/blocks10", scopes=["Block"])
>>> write_report(result, "blocks10.html")
>>> write_report("models/artifacts/blocks10", "x.html", scopes=["Block"])   # the same from a path

The page holds, inline (no file or network access needed to view it): a summary table (estimated
planned peak before and after, ratio, what was cloned, what onnxruntime's own rewrites did),
the memory timeline (:mod:`onnx_remat.show.timeline`, inline SVG), the per-scope table (stored
activations, what recomputing each scope releases, what is alive at the peak), the segments, the
largest tensors alive at each peak, and the graph of the rewritten region (:mod:`onnx_remat.show.graph_view`,
inline SVG; without Graphviz the DOT text and a note). ``onnx-remat report`` and
``onnx-remat apply --report`` call :func:`write_report`.
"""

from __future__ import annotations

import datetime as _dt
import html
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from onnx_remat import __version__
from onnx_remat.analysis.model import ModelAnalysis, analyze_model
from onnx_remat.errors import RematError, UsageError
from onnx_remat.estimate import EstimateResult, MemoryEstimate, estimate
from onnx_remat.model_io import check_output, write_file
from onnx_remat.units import format_bytes, format_ratio

_CSS = """
body{font-family:Helvetica,Arial,sans-serif;margin:1.5em auto;max-width:1200px;color:#222;padding:0 1em}
h1{font-size:1.45em;margin-bottom:.2em} h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0} td,th{padding:.25em .7em;border-bottom:1px solid #eee}
th{text-align:left;background:#f4f6f8} td.num{text-align:right;font-variant-numeric:tabular-nums}
.big{font-size:1.25em;font-weight:bold} .muted{color:#777} .note{color:#8a4b00}
.figure svg{max-width:100%;height:auto} .graph{overflow:auto;border:1px solid #eee;padding:.5em}
.graph svg{max-width:100%;height:auto} code{background:#f4f4f4;padding:0 .2em}
pre{background:#f6f6f6;padding:1em;overflow:auto;font-size:.8em}
"""


def _e(text) -> str:
    return html.escape(str(text))


def _row(cells: Sequence, numeric: Iterable[int] = ()) -> str:
    numeric = set(numeric)
    return (
        "<tr>"
        + "".join(f"<td class=num>{_e(c)}</td>" if i in numeric else f"<td>{_e(c)}</td>" for i, c in enumerate(cells))
        + "</tr>"
    )


def _summary(est: EstimateResult) -> str:
    b, a = est.before, est.after
    rows = [
        (
            "planned peak (block onnxruntime allocates per step)",
            format_bytes(b.planned_peak_bytes),
            format_bytes(a.planned_peak_bytes) if a else "-",
        ),
        ("peak of live activations", format_bytes(b.peak_live_bytes), format_bytes(a.peak_live_bytes) if a else "-"),
        (
            "peak at",
            f"step {b.peak_step + 1}/{len(b.steps)}: {b.peak_node} ({b.peak_region})",
            f"step {a.peak_step + 1}/{len(a.steps)}: {a.peak_node} ({a.peak_region})" if a else "-",
        ),
        ("nodes onnxruntime runs", len(b.steps), len(a.steps) if a else "-"),
        (
            "allocated outside the block (shapes known at run time only)",
            format_bytes(b.outside_block_bytes) if b.outside_block else "-",
            (format_bytes(a.outside_block_bytes) if a.outside_block else "-") if a else "-",
        ),
        ("activations of unknown size (not counted)", len(b.unknown), len(a.unknown) if a else "-"),
    ]
    body = "".join(_row(r) for r in rows)
    ratio = ""
    if a is not None:
        sel = est.selection or {}
        ratio = (
            f"<p class=big>after / before: {_e(format_ratio(a.planned_peak_bytes, b.planned_peak_bytes))} "
            f"<span class=muted>({_e(sel.get('cloned_nodes', 0))} nodes cloned in {_e(sel.get('segments', 0))} "
            f"segments; {_e(format_bytes(sel.get('released_bytes', 0)))} of stored activations released after "
            "the forward pass, by the plan)</span></p>"
        )
    rewrites = ", ".join(f"{v} {k}" for k, v in sorted(b.runtime_rewrites.items(), key=lambda kv: -kv[1])) or "none"
    return (
        f"{ratio}<table><tr><th></th><th>before</th><th>after</th></tr>{body}</table>"
        f"<p class=muted>Estimated without running the model: onnxruntime 1.19's CPU graph rewrites ({_e(rewrites)}), "
        f"its execution order ({_e(b.order_source)}) and its memory planner are emulated "
        "(<code>onnx_remat.estimate</code>). Measure with <code>onnx-remat measure</code>.</p>"
    )


def _scope_table(est: EstimateResult, max_depth: int) -> str:
    rows = [s for s in est.scopes if s.depth <= max_depth]
    if not rows:
        return "<p class=muted>No scope information.</p>"
    body = "".join(
        _row(
            [
                "\u00a0\u00a0" * s.depth + s.path,
                (s.class_name or "").rsplit(".", 1)[-1],
                format_bytes(s.stored_bytes) + (f" +{s.stored_unknown}?" if s.stored_unknown else ""),
                format_bytes(s.releasable_bytes),
                format_bytes(s.live_at_peak_bytes),
            ],
            numeric=(2, 3, 4),
        )
        for s in rows
    )
    return (
        "<table><tr><th>scope</th><th>class</th><th>stored for backward</th><th>recomputing it releases</th>"
        f"<th>alive at the peak (before)</th></tr>{body}</table>"
    )


def _segment_table(est: EstimateResult) -> str:
    if not est.segments:
        return "<p class=muted>No rewrite.</p>"
    body = "".join(
        _row(
            [
                s["label"],
                s.get("cloned_nodes", len(s.get("clones", []))),
                len(s.get("targets", [])),
                format_bytes(s.get("released_bytes", 0)),
                ", ".join(s.get("triggers", [])[:2]) or "-",
            ],
            numeric=(1, 2, 3),
        )
        for s in est.segments
    )
    skipped = "".join(f"<li>{_e(s['label'])}: {_e(s['reason'])}</li>" for s in est.skipped)
    return (
        "<table><tr><th>segment</th><th>cloned nodes</th><th>recomputed activations</th>"
        f"<th>stored bytes released</th><th>runs when the backward pass reaches</th></tr>{body}</table>"
        + (f"<p>Skipped:</p><ul>{skipped}</ul>" if skipped else "")
    )


def _live_table(label: str, est: MemoryEstimate, top: int) -> str:
    body = "".join(
        _row([format_bytes(t.bytes), t.tensor, t.scope or "", t.region], numeric=(0,)) for t in est.live_at_peak[:top]
    )
    more = len(est.live_at_peak) - top
    tail = (
        f"<p class=muted>… {more} more ({_e(format_bytes(sum(t.bytes for t in est.live_at_peak[top:])))})</p>"
        if more > 0
        else ""
    )
    return (
        f"<h3 style='font-size:1em'>{_e(label)}: {_e(format_bytes(est.planned_peak_bytes))} at "
        f"<code>{_e(est.peak_node)}</code></h3><table><tr><th>bytes</th><th>tensor</th><th>scope</th>"
        f"<th>made by</th></tr>{body}</table>{tail}"
    )


def report_html(
    est: EstimateResult,
    *,
    timeline_svg: str | None,
    graph_svg: str | None,
    graph_dot: str | None,
    graph_notes: Sequence[str] = (),
    title: str | None = None,
    scope_depth: int = 1,
    top: int = 10,
    timestamp: _dt.datetime | None = None,
) -> str:
    """The report page for an estimate and the pictures already rendered. The same input gives
    the same bytes: the page carries a date only when ``timestamp`` is given (:func:`report_date`)."""
    title = title or f"onnx-remat: {est.model}"
    if graph_svg is not None:
        graph = f"<div class=graph>{graph_svg}</div>"
    elif graph_dot is not None:
        graph = (
            "<p class=note>Graphviz (<code>dot</code>) is not installed, so the graph is given as DOT text: "
            "install graphviz and render it with <code>dot -Tsvg</code>.</p>"
            f"<pre>{_e(graph_dot)}</pre>"
        )
    else:
        graph = "<p class=muted>No graph.</p>"
    notes = "".join(f"<li>{_e(n)}</li>" for n in list(est.notes) + list(graph_notes))
    lives = _live_table("before", est.before, top) + (_live_table("after", est.after, top) if est.after else "")
    written = f"Written by onnx-remat {_e(__version__)}" + (
        f" on {_e(timestamp.strftime('%Y-%m-%d %H:%M UTC'))}" if timestamp is not None else ""
    )
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        f"<meta name=viewport content='width=device-width, initial-scale=1'><title>{_e(title)}</title>"
        f"<style>{_CSS}</style></head><body>"
        f"<h1>{_e(title)}</h1>"
        f"<p class=muted>{_e(est.model)}" + (f" · dims {_e(est.dims)}" if est.dims else "") + "</p>"
        "<h2>Summary</h2>"
        + _summary(est)
        + "<h2>Memory over one training step</h2>"
        + (
            f"<div class=figure>{timeline_svg}</div>"
            if timeline_svg
            else "<p class=muted>No plot (matplotlib missing).</p>"
        )
        + "<h2>Scopes</h2>"
        + _scope_table(est, scope_depth)
        + "<h2>Segments</h2>"
        + _segment_table(est)
        + "<h2>Largest tensors alive at the peak</h2>"
        + lives
        + "<h2>The rewritten region</h2>"
        + graph
        + (f"<h2>Notes</h2><ul>{notes}</ul>" if notes else "")
        + f"<p class=muted>{written}.</p>"
        "</body></html>\n"
    )


def report_date(timestamp: bool = False) -> _dt.datetime | None:
    """The date a report carries: ``SOURCE_DATE_EPOCH`` (seconds since 1970, the reproducible-builds
    convention) when set, else now when ``timestamp`` is asked for, else none (reproducible bytes).
    Raises :class:`UsageError` for a ``SOURCE_DATE_EPOCH`` that is not a whole number."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch is not None and epoch.strip():
        if not epoch.strip().isascii() or not epoch.strip().isdigit():
            raise UsageError(f"SOURCE_DATE_EPOCH={epoch!r}: not a whole number of seconds since 1970")
        try:
            return _dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc)
        except (OverflowError, OSError, ValueError):
            raise UsageError(f"SOURCE_DATE_EPOCH={epoch!r}: out of range") from None
    if timestamp:
        return _dt.datetime.now(_dt.timezone.utc)
    return None


def write_report(
    source,
    path: str | os.PathLike,
    *,
    scopes=None,
    op_types=None,
    nodes=None,
    recompute_outputs: bool = False,
    dims: dict[str, int] | None = None,
    expand: int = 2,
    focus=None,
    title: str | None = None,
    execution_order: Sequence[str] | None = None,
    after_execution_order: Sequence[str] | None = None,
    force: bool = False,
    timestamp: bool = False,
) -> Path:
    """Write the HTML report of a rewrite to ``path`` (``.html``); returns the path.

    Written atomically; an existing file is replaced only with ``force``. The page has the same
    bytes for the same input unless ``timestamp`` (or ``SOURCE_DATE_EPOCH``) adds a date.

    ``source``: an :class:`~onnx_remat.ApplyResult` (what ``apply`` returned), or a model (path,
    artifacts directory, ModelProto) plus the selection keywords, which are applied in memory.
    Without a selection the report covers the graph as it is. Raises :class:`RematError` for an
    output that is not ``.html`` or cannot be written.
    """
    out = Path(path)
    if out.suffix.lower() not in (".html", ".htm"):
        raise RematError(f"{out}: the report is an HTML page; give a .html path")
    check_output(out, force=force)
    date = report_date(timestamp)
    from onnx_remat.remat.apply import apply
    from onnx_remat.remat.result import ApplyResult
    from onnx_remat.show.graph_view import graph_view, graphviz_available, render, to_dot

    applied: ApplyResult | ModelAnalysis
    if isinstance(source, ApplyResult):
        applied = source
    else:
        analysis = source if isinstance(source, ModelAnalysis) else analyze_model(source, dims=dims)
        selected = any(x for x in (scopes, op_types, nodes))
        applied = (
            apply(analysis, scopes=scopes, op_types=op_types, nodes=nodes, recompute_outputs=recompute_outputs)
            if selected
            else analysis
        )
    est = estimate(applied, execution_order=execution_order, after_execution_order=after_execution_order)
    view = graph_view(applied, focus=focus, expand=expand)
    try:
        from onnx_remat.show.timeline import svg_text

        timeline_svg = svg_text(est)
    except RematError:
        timeline_svg = None
    dot_text = to_dot(view)
    graph_svg = None
    if graphviz_available():
        svg = render(dot_text, "svg").decode()
        graph_svg = svg[svg.index("<svg") :] if "<svg" in svg else svg
    graph_notes = [f"graph: drew {', '.join(view.clusters) or 'no scope'} in full; collapsed {view.summary()}"] + list(
        view.notes
    )
    page = report_html(
        est,
        timeline_svg=timeline_svg,
        graph_svg=graph_svg,
        graph_dot=dot_text,
        graph_notes=graph_notes,
        title=title,
        timestamp=date,
    )
    write_file(out, page, force=force)
    return out
