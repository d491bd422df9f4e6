"""``onnx-remat check MODEL --scope PATTERN --baseline FILE``: a regression gate for CI.

Applies the rewrite in memory, measures the original and the rewritten graph, and compares the
figures with a baseline file: verdict table, then PASSED/FAILED. Exit status 0 pass, 1 regression
or gradient mismatch, 2 usage error (missing baseline, bad threshold), 3 environment problem
(onnxruntime missing, no GPU). The work is :func:`onnx_remat.runtime.gate.check`; this module parses,
calls and prints.
"""

from __future__ import annotations

import math
from pathlib import Path

import click
from rich import box
from rich.table import Table
from rich.text import Text

from onnx_remat.cli.common import (
    Tolerance,
    console,
    err_console,
    json_safe,
    model_argument,
    outputs,
    run_inputs,
    run_kwargs,
    run_options,
    selection_options,
    write_json,
)
from onnx_remat.cli.tables import progress_display, titled
from onnx_remat.errors import UsageError
from onnx_remat.model_io import make_parents
from onnx_remat.units import format_bytes, parse_percent

_STYLE = {"PASS": "green", "FAIL": "bold red", "INFO": "dim"}


def _value(v, unit: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if unit == "bytes":
        return format_bytes(v)
    if unit == "ratio":
        return f"x{v:.3f}"
    if unit == "seconds":
        return f"{v * 1000:.1f} ms" if v < 1 else f"{v:.3f} s"
    return str(v)


def _threshold(c) -> str:
    if c.limit is None or c.unit not in ("bytes", "ratio"):
        return c.threshold
    return f"{c.threshold} ({_value(c.limit, c.unit)})"


def verdict_table(v) -> Table:
    """One row per check: what, baseline, now, threshold, PASS/FAIL (INFO: shown, not gated)."""
    sel = v.selection
    what = ", ".join(
        [f"scope {s}" for s in sel["scopes"]]
        + [f"op type {o}" for o in sel["op_types"]]
        + [f"node {n}" for n in sel["nodes"]]
    ) + (" + outputs" if sel["recompute_outputs"] else "")
    table = Table(
        title=f"{v.model} ({what}) against {v.baseline_path}  [dim]({v.device}, {v.steps} timed step"
        f"{'s' if v.steps != 1 else ''} after {v.warmup} warm-up, seed {v.seed})[/dim]",
        box=box.SIMPLE_HEAVY,
        title_justify="left",
    )
    for col, justify in (
        ("check", "left"),
        ("baseline", "right"),
        ("now", "right"),
        ("threshold", "left"),
        ("result", "left"),
    ):
        table.add_column(col, justify=justify, overflow="fold")
    for c in v.checks:
        result = Text(c.status, style=_STYLE.get(c.status, ""))
        if c.message:
            result.append(f" {c.message}", style="yellow" if c.status != "FAIL" else "red")
        table.add_row(c.what, _value(c.baseline, c.unit), _value(c.now, c.unit), _threshold(c), result)
    return table


def closing_line(v) -> Text:
    """PASSED/FAILED with the duration."""
    gated = sum(1 for c in v.checks if c.gated and c.status != "INFO")
    if v.baseline_updated:
        return Text(f"PASSED ({v.duration_s:.1f} s): baseline written to {v.baseline_path}", style="bold green")
    if v.passed:
        return Text(
            f"PASSED ({v.duration_s:.1f} s): {gated} gated checks against {v.baseline_path}", style="bold green"
        )
    names = "; ".join(c.what for c in v.failures) or "baseline not written"
    return Text(f"FAILED ({v.duration_s:.1f} s): {names}", style="bold red")


def parse_fraction(text: str, option: str) -> float:
    """``'2%'`` or ``'0.02'`` -> 0.02; a bare number above 1 (``'2'``) is refused as a likely typo of 2%."""
    value = parse_percent(text)
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{option} {text}: give a finite percentage >= 0 (2%, or 0.02)")
    if not text.strip().endswith("%") and value > 1:
        raise UsageError(
            f"{option} {text}: a bare number is a fraction ({value * 100:g}%); write {text}% if you mean percent"
        )
    return value


@click.command("check")
@model_argument
@selection_options
@click.option(
    "--baseline",
    type=click.Path(path_type=Path),
    required=True,
    metavar="FILE",
    help="The baseline JSON to compare with (written by --update-baseline).",
)
@click.option(
    "--max-peak-increase",
    default="2%",
    show_default=True,
    metavar="PCT",
    help="Largest allowed rise of a planned peak over the baseline (2%, or 0.02).",
)
@click.option(
    "--max-time-increase",
    default="25%",
    show_default=True,
    metavar="PCT",
    help="With --check-time: largest allowed rise of the rewritten/original step-time ratio.",
)
@click.option("--check-time", is_flag=True, help="Also gate the step-time ratio (noisy on shared machines).")
@click.option(
    "--update-baseline",
    is_flag=True,
    help="Write the baseline from this run (atomically; refused when gradients differ).",
)
@click.option(
    "--atol",
    type=Tolerance(),
    default=0.0,
    show_default=True,
    help="Absolute tolerance of the gradient comparison (0 with --rtol 0: bit for bit).",
)
@click.option("--rtol", type=Tolerance(), default=0.0, show_default=True, help="Relative tolerance.")
@run_options(steps=None, steps_help="Timed steps per graph [default: 1, or 5 with --check-time].", live=False)
@click.pass_context
def command(
    ctx,
    model,
    scopes,
    op_types,
    nodes,
    recompute_outputs,
    baseline,
    max_peak_increase,
    max_time_increase,
    check_time,
    update_baseline,
    atol,
    rtol,
    json_out,
    **options,
):
    """Check MODEL's recompute rewrite against a stored baseline (a CI regression gate).

    Rewrites MODEL in memory, measures original and rewrite with onnxruntime, and compares with
    the baseline: gradients bit-identical; planned peaks of the original (a model change) and of
    the rewrite (a rewrite change) within --max-peak-increase; segment, clone and barrier counts,
    and what onnxruntime kept of them. Step time only with --check-time. Without a selection the
    baseline's is used.

    Exit status: 0 passed, 1 regression or gradient mismatch, 2 usage error (missing baseline,
    bad threshold), 3 environment problem (onnxruntime missing, no GPU).

    \b
    Examples:
      onnx-remat check models/artifacts/blocks10 --scope Block --baseline blocks10.json --update-baseline
      onnx-remat check models/artifacts/blocks10 --scope Block --baseline blocks10.json
      onnx-remat check model_dir --scope 'layers.*' --baseline b.json --check-time --max-time-increase 30%
    """
    to_stdout = json_out is not None and str(json_out) == "-"
    out = err_console if to_stdout else console
    force = options.pop("force")
    inputs = {"MODEL": model, **run_inputs(options)}
    if not update_baseline:
        inputs["--baseline"] = baseline
    with outputs(inputs, force=force) as outs:
        outs.claim(json_out, "--json")
        if update_baseline:  # a new folder for it is made (and removed again if the check fails)
            outs.claim(baseline, "--baseline", force=True, parents=True)
            make_parents(baseline)
        v = _check(
            out,
            model,
            baseline=baseline,
            scopes=scopes,
            op_types=op_types,
            nodes=nodes,
            recompute_outputs=recompute_outputs,
            max_peak_increase=parse_fraction(max_peak_increase, "--max-peak-increase"),
            max_time_increase=parse_fraction(max_time_increase, "--max-time-increase"),
            check_time=check_time,
            update=update_baseline,
            atol=atol,
            rtol=rtol,
            **run_kwargs(**options),
        )
        out.print(titled(verdict_table(v)))
        for line in v.diagnosis:
            out.print(Text(f"note: {line}", style="yellow"))
        out.print(closing_line(v))
        write_json(json_safe(v.to_json()), json_out, force=force)
    if not v.passed:
        ctx.exit(1)


def _check(out, model, **kwargs):
    """:func:`onnx_remat.runtime.gate.check` with a progress display on ``out``."""
    from onnx_remat.runtime.gate import check

    with progress_display(out) as progress:
        return check(model, progress=progress, **kwargs)
