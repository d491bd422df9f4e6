"""``onnx-remat schedule``: reorder a training graph for a lower peak, without recomputing anything."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from onnx_remat.cli.common import (
    console,
    dims_from,
    dims_option,
    json_option,
    model_argument,
    outputs,
    print_notes,
    write_json,
)
from onnx_remat.model_io import remat_output
from onnx_remat.units import format_bytes, format_ratio

ACCUMULATION_HELP = (
    "How partial gradients of one parameter (tied or shared weights) are added: 'inplace' (default) adds "
    "them into the first one's buffer in the gradient builder's order, bit-identical in every case; 'early' "
    "adds each into the parameter's gradient buffer as soon as it exists (the lowest peak; bit-identical when "
    "gradients are reset every step, as onnxruntime-training's lazy_reset_grad does, but rounding differently "
    "when gradients accumulate over several steps); 'sum' keeps the gradient builder's Sum."
)


def accumulation_option(f):
    return click.option(
        "--grad-accumulation",
        type=click.Choice(["inplace", "early", "sum"]),
        default="inplace",
        show_default=True,
        help=ACCUMULATION_HELP,
    )(f)


@click.command("schedule")
@model_argument
@dims_option
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    help="Output file or artifacts directory (default, in the current directory: NAME.scheduled.onnx, or "
    "<artifacts>_scheduled/).",
)
@click.option("--force", is_flag=True, help="Replace existing output files or artifacts directories (never an input).")
@accumulation_option
@json_option
@click.option("-q", "--quiet", is_flag=True, help="Print only where the result was written (no estimate).")
def command(model, dims, output, force, grad_accumulation, json_out, quiet):
    """Give MODEL an execution order with a lower planned peak; nothing is recomputed.

    onnxruntime runs a graph in an order it derives from the node list. This command tries
    several orders (list schedulers, as XLA's memory scheduler does), writes the one with the
    lowest planned peak into the node list (the gradient accumulators' places), and checks it by
    emulating onnxruntime on the written graph; a graph no order improves is written unchanged.
    The same nodes compute the same values: loss and gradients keep every bit (`onnx-remat
    compare` checks it). `onnx-remat apply` does this after its rewrite, by default.

    \b
    Examples:
      onnx-remat schedule models/artifacts/gpt
      onnx-remat schedule training_model.onnx -o scheduled.onnx --grad-accumulation early
    """
    import onnx_remat

    out_path, out_is_dir = remat_output(model, output, kind="scheduled")
    with outputs({"MODEL": model}, force=force) as outs:
        outs.claim(out_path, "-o", is_dir=out_is_dir)
        outs.claim(json_out, "--json")
        result = onnx_remat.schedule(model, grad_accumulation=grad_accumulation, dims=dims_from(dims))
        written = result.save(out_path, force=force)
        if not quiet:
            print_schedule(result)
        console.print(f"wrote {written}")
        write_json({**result.summary(), "output": str(written)}, json_out, force=force)


def print_schedule(result) -> None:
    """The candidates tried and the estimate before -> after of a :class:`onnx_remat.ScheduledModel`."""
    sched = result.schedule
    table = Table(show_edge=False, header_style="bold")
    table.add_column("order tried")
    table.add_column("predicted peak", justify="right")
    table.add_column("written and emulated", justify="right")
    for c in sched.candidates:
        checked = format_bytes(c.planned_peak_bytes) if c.planned_peak_bytes is not None else "-"
        mark = " [bold](chosen)[/]" if c is sched.chosen else ""
        table.add_row(c.label + mark, format_bytes(c.predicted_peak_bytes), checked)
    console.print(table)
    for acc in sched.accumulated:
        how = "into the gradient buffer as each exists" if acc.mode == "early" else "in place, in the Sum's order"
        console.print(f"{acc.parameter}: {len(acc.partials)} partial gradients added {how}")
    notes = [f"{param}: {why}" for param, why in sched.accumulation_skipped]
    if sched.pins:
        console.print(f"{len(sched.pins)} random ops pinned to their original order")
    before, after = result.planned_peak_before, result.planned_peak_after
    console.print(
        f"estimated planned peak (onnxruntime CPU, emulated, nothing run): {format_bytes(before)} -> "
        f"{format_bytes(after)} ({format_ratio(after, before)}); `onnx-remat compare` measures it"
    )
    print_notes(notes + list(sched.notes))
