"""The trade-off curve of recompute under a memory budget: planned peak against added compute.

>>> from onnx_remat.remat.budget import BudgetPlanner
>>> from onnx_remat.show.tradeoff import plot_sweep
>>> plot_sweep(BudgetPlanner(analysis).sweep(), "curve.png")

One figure: each budget's chosen plan (estimated planned peak, compute added as a share of a
step), joined from the unrewritten graph down to the lowest reachable peak; per-layer recompute
and ``--recompute-outputs`` marked as the references they are; optional measured points
(``measured=[(added, planned peak bytes), ...]``). matplotlib headless; ``.png`` or ``.svg``.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

from onnx_remat.errors import EnvironmentProblem, RematError
from onnx_remat.model_io import write_file

FORMATS = (".png", ".svg")
MiB = 1024 * 1024
_MARK = {"per-layer": ("s", "#d1495b"), "recompute-outputs": ("D", "#8f5ac2")}
_LABEL = {"per-layer": "per-layer recompute (--scope)", "recompute-outputs": "--scope --recompute-outputs"}


def figure(sweep, *, title: str | None = None, measured=None, width: float = 7.0, height: float = 4.6):
    """A matplotlib ``Figure`` of ``sweep`` (a :class:`~onnx_remat.remat.budget.Sweep`)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:  # pragma: no cover - matplotlib is a declared extra
        raise EnvironmentProblem("plots need matplotlib: pip install 'onnx-remat[viz]'") from None
    fig = Figure(figsize=(width, height), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    pts = sorted(
        {(p.plan.added * 100, p.plan.written_peak / MiB) for p in sweep.points if p.plan is not None}
        | {(0.0, sweep.baseline_peak / MiB), (sweep.floor.added * 100, sweep.floor.written_peak / MiB)}
    )
    # the curve: for each added compute, the lowest peak found with at most that much
    frontier = []
    best = float("inf")
    for x, y in pts:
        if y < best:
            frontier.append((x, y))
            best = y
    ax.step(
        [x for x, _ in frontier],
        [y for _, y in frontier],
        where="post",
        color="#1f5fa8",
        lw=1.6,
        label="onnx-remat --budget (estimated)",
        zorder=3,
    )
    ax.plot([x for x, _ in pts], [y for _, y in pts], "o", color="#1f5fa8", ms=5, zorder=4)
    for ref in sweep.references:
        marker, color = _MARK.get(ref.source, ("^", "#555555"))
        ax.plot(
            [ref.added * 100],
            [ref.written_peak / MiB],
            marker,
            color=color,
            ms=8,
            zorder=5,
            label=f"--scope per layer: {ref.source}",
        )
    if measured:
        ax.plot(
            [a * 100 for a, _ in measured],
            [p / MiB for _, p in measured],
            "x",
            color="#2a9d46",
            ms=8,
            mew=2,
            zorder=6,
            label="measured planned peak",
        )
    ax.axhline(sweep.baseline_peak / MiB, color="#888888", lw=0.8, ls=":", zorder=1)
    ax.axhline(sweep.floor.written_peak / MiB, color="#888888", lw=0.8, ls="--", zorder=1)
    ax.annotate("unrewritten", (0, sweep.baseline_peak / MiB), textcoords="offset points", xytext=(4, -12), fontsize=8)
    ax.annotate(
        f"lowest reachable {sweep.floor.written_peak / MiB:.1f} MiB",
        (0, sweep.floor.written_peak / MiB),
        textcoords="offset points",
        xytext=(4, 4),
        fontsize=8,
    )
    ax.set_xlabel(f"added compute (% of a training step, {sweep.cost_source} costs)")
    ax.set_ylabel("planned peak (MiB)")
    ax.set_ylim(0, sweep.baseline_peak / MiB * 1.08)
    ax.set_xlim(left=-2)
    ax.grid(color="#dddddd", lw=0.5)
    ax.set_title(title or "planned peak against added compute", fontsize=10)
    ax.legend(loc="upper right", fontsize=8, framealpha=0.9)
    fig.tight_layout()
    return fig


def plot_sweep(sweep, path: str | os.PathLike, *, title: str | None = None, measured=None, force: bool = False) -> Path:
    """Write the curve of ``sweep`` to ``path`` (``.png`` or ``.svg``), the same bytes for the same
    curve, atomically; an existing file is replaced only with ``force``. Returns the path."""
    from matplotlib import rc_context

    from onnx_remat.model_io import check_output
    from onnx_remat.show.timeline import SVG_NO_DATE

    out = Path(path)
    if out.suffix.lower() not in FORMATS:
        raise RematError(f"{out}: cannot write a {out.suffix or 'suffix-less'} plot; give a .png or .svg path")
    check_output(out, force=force)
    fmt = out.suffix[1:].lower()
    buf = io.BytesIO()
    fig = figure(sweep, title=title, measured=measured)
    with rc_context({"svg.hashsalt": "onnx-remat"}):
        fig.savefig(buf, format=fmt, dpi=100, metadata=SVG_NO_DATE if fmt == "svg" else None)
    return write_file(out, buf.getvalue(), force=force)
