"""Memory-over-time plots of a training step, before and after a recompute rewrite.

>>> import onnx_remat
>>> from onnx_remat.show.timeline import plot_timeline
>>> plot_timeline(onnx_remat.estimate("models/artifacts/blocks10", scopes=["Block"]), "timeline.png")

One figure: the bytes of activations alive at every execution step (one curve per graph), the
forward and backward regions shaded, the steps that recompute (clones and barriers) marked along
the bottom, each curve's peak marked and the planned block of each drawn as a dashed line. The
x axis is the execution step: the rewrite only adds steps to the backward pass, so the forward
parts of both curves line up.

The curves come from :func:`onnx_remat.estimate`, whose order is onnxruntime's emulated DEFAULT
order, or the order onnxruntime really ran when ``execution_order=`` (node names from a profile)
is given to it, or to :func:`timeline_from_order` here. matplotlib is used headless (no pyplot,
no display); ``.png`` and ``.svg`` are written.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from onnx_remat.errors import EnvironmentProblem, RematError
from onnx_remat.estimate import BACKWARD, FORWARD, RECOMPUTE, EstimateResult, MemoryEstimate, estimate
from onnx_remat.model_io import check_output, write_file

FORMATS = (".png", ".svg")
MiB = 1024 * 1024
_COLORS = {"before": "#1f5fa8", "after": "#d1495b"}
_REGION_SHADE = {FORWARD: "#dbe8f6", BACKWARD: "#fbe7d3"}


def _series(source) -> list[tuple[str, MemoryEstimate]]:
    if isinstance(source, EstimateResult):
        out = [("before", source.before)]
        if source.after is not None:
            out.append(("after", source.after))
        return out
    if isinstance(source, MemoryEstimate):
        return [("estimate", source)]
    return [(str(label), est) for label, est in source]


def _regions(steps_regions: Sequence[str]) -> list[tuple[str, int, int]]:
    """Contiguous runs of forward / backward steps (recompute counts as backward)."""
    runs: list[tuple[str, int, int]] = []
    for i, r in enumerate(steps_regions):
        r = BACKWARD if r == RECOMPUTE else r
        if runs and runs[-1][0] == r:
            runs[-1] = (r, runs[-1][1], i)
        else:
            runs.append((r, i, i))
    return runs


def figure(source, *, title: str | None = None, width: float = 10.0, height: float = 4.4):
    """A matplotlib ``Figure`` of the timeline (see the module docstring)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:  # pragma: no cover - matplotlib is a declared extra
        raise EnvironmentProblem("plots need matplotlib: pip install 'onnx-remat[viz]'") from None
    series = _series(source)
    if not series:
        raise RematError("nothing to plot")
    fig = Figure(figsize=(width, height), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    longest = max(len(est.steps) for _, est in series)
    top = max(max((s.live_bytes for s in est.steps), default=0) for _, est in series)
    ymax = max(top, max(est.planned_peak_bytes for _, est in series)) / MiB or 1.0
    base = max((est for _, est in series), key=lambda e: len(e.steps))  # the longest spans every step
    runs = _regions([s.region for s in base.steps])
    shaded = set()
    for region, start, end in runs:
        stop = end + 1
        label = None
        if region not in shaded:
            label = f"{region} pass"
            shaded.add(region)
        ax.axvspan(start - 0.5, stop - 0.5, color=_REGION_SHADE.get(region, "#eeeeee"), lw=0, label=label, zorder=0)
    for label, est in series:
        color: Any = _COLORS.get(label)
        xs = list(range(len(est.steps)))
        ys = [s.live_bytes / MiB for s in est.steps]
        (line,) = ax.plot(
            xs, ys, lw=1.6, color=color, label=f"{label}: planned peak {est.planned_peak_bytes / MiB:.1f} MiB", zorder=3
        )
        color = line.get_color()
        ax.axhline(est.planned_peak_bytes / MiB, color=color, lw=0.9, ls="--", alpha=0.8, zorder=2)
        if est.steps:
            k = max(range(len(ys)), key=lambda i: ys[i])
            ax.plot([k], [ys[k]], "o", color=color, ms=6, zorder=4)
            ax.annotate(
                f"peak {ys[k]:.1f} MiB\n{_short(est.steps[k].node)}",
                (k, ys[k]),
                textcoords="offset points",
                xytext=(6, 6 if label != "after" else -24),
                fontsize=7.5,
                color=color,
            )
        rec = [i for i, s in enumerate(est.steps) if s.region == RECOMPUTE]
        if rec:
            ax.plot(
                rec,
                [ymax * 0.015] * len(rec),
                "|",
                color="#2a9d46",
                ms=7,
                mew=1.0,
                zorder=3,
                label=f"{label}: recompute steps ({len(rec)})",
            )
    ax.set_xlim(-0.5, longest - 0.5)
    ax.set_ylim(0, ymax * 1.18)
    ax.set_xlabel("execution step (onnxruntime node order)")
    ax.set_ylabel("activations alive (MiB)")
    order_note = series[0][1].order_source
    ax.set_title(title or f"Activation memory over one training step — {order_note}", fontsize=10)
    ax.grid(axis="y", color="#cccccc", lw=0.5)
    ax.legend(loc="upper right", fontsize=8, framealpha=0.9)
    fig.tight_layout()
    return fig


def _short(name: str, n: int = 48) -> str:
    return name if len(name) <= n else "…" + name[-(n - 1) :]


SVG_NO_DATE = {"Date": None}
"""``savefig`` metadata of an SVG without its date. matplotlib's SVG carries the date and random ids
(clip paths, glyphs): both are fixed where a figure is saved, here and in :mod:`.tradeoff` (this
metadata, and a fixed ``svg.hashsalt`` for the ids), so the same figure gives the same bytes. PNG
carries neither."""


def render(source, fmt: str, *, title: str | None = None) -> bytes:
    """The timeline of ``source`` as ``png`` or ``svg`` bytes, the same bytes for the same input."""
    fig = figure(source, title=title)  # EnvironmentProblem without matplotlib
    from matplotlib import rc_context

    buf = io.BytesIO()
    with rc_context({"svg.hashsalt": "onnx-remat"}):
        fig.savefig(buf, format=fmt, dpi=100, metadata=SVG_NO_DATE if fmt == "svg" else None)
    return buf.getvalue()


def plot_timeline(source, path: str | os.PathLike, *, title: str | None = None, force: bool = False) -> Path:
    """Write the timeline of ``source`` (an :class:`EstimateResult`, a :class:`MemoryEstimate`, or
    ``[(label, MemoryEstimate), ...]``) to ``path`` (``.png`` or ``.svg``); returns the path.

    Rendered in memory, then written atomically (:func:`onnx_remat.model_io.write_file`: a full
    disk leaves no truncated picture); an existing file is replaced only with ``force``."""
    out = Path(path)
    if out.suffix.lower() not in FORMATS:
        raise RematError(f"{out}: cannot write a {out.suffix or 'suffix-less'} plot; give a .png or .svg path")
    check_output(out, force=force)
    return write_file(out, render(source, out.suffix[1:].lower(), title=title), force=force)


def svg_text(source, *, title: str | None = None) -> str:
    """The timeline as SVG markup (for embedding in HTML)."""
    text = render(source, "svg", title=title).decode("utf-8")
    return text[text.index("<svg") :] if "<svg" in text else text


def timeline_from_order(model, execution_order: Sequence[str], path: str | os.PathLike, **kwargs) -> Path:
    """Plot ``model``'s memory over the order onnxruntime really ran (node names, e.g. from a
    profile); ``kwargs`` go to :func:`onnx_remat.estimate` (a selection adds the rewrite)."""
    return plot_timeline(estimate(model, execution_order=execution_order, **kwargs), path)
