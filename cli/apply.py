"""``onnx-remat apply``: rewrite a training graph so selected activations are recomputed."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

import onnx_remat
from onnx_remat.cli.common import (
    console,
    dims_from,
    dims_option,
    dropout_option,
    json_option,
    model_argument,
    outputs,
    print_notes,
    selection_options,
    write_json,
)
from onnx_remat.cli.plan import budget_option, budget_options, budget_verdict, print_budget, resolve_profile
from onnx_remat.cli.schedule import accumulation_option
from onnx_remat.errors import RematError
from onnx_remat.model_io import remat_output
from onnx_remat.show.report import report_date, write_report
from onnx_remat.units import format_bytes, format_ratio


@click.command("apply")
@model_argument
@selection_options
@dropout_option
@budget_option
@budget_options
@dims_option
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    help="Output file or artifacts directory (default, in the current directory: NAME.remat.onnx, or "
    "<artifacts>_remat/).",
)
@click.option("--force", is_flag=True, help="Replace existing output files or artifacts directories (never an input).")
@json_option
@click.option(
    "--measure",
    is_flag=True,
    help="Then run original and result with onnxruntime-training (as `compare`): peaks, step time, "
    "and whether loss and gradients are unchanged (exit 1 if not).",
)
@click.option(
    "--estimate/--no-estimate",
    default=True,
    show_default=True,
    help="Estimate the planned peak before and after (static: nothing runs; ~0.3 ms per node), skip segments "
    "that would raise it, and print it. --no-estimate skips both.",
)
@click.option(
    "--schedule/--no-schedule",
    default=True,
    show_default=True,
    help="Then give the rewrite the execution order with the lowest planned peak (as `onnx-remat schedule`).",
)
@accumulation_option
@click.option("--report", type=click.Path(path_type=Path), metavar="OUT.html", help="Also write the HTML report.")
@click.option("--timestamp", is_flag=True, help="Put the date in the --report page (default: none, reproducible).")
@click.option("-q", "--quiet", is_flag=True, help="Print only where the result was written (no estimate).")
@click.pass_context
def apply_cmd(
    ctx,
    model,
    scopes,
    op_types,
    nodes,
    recompute_outputs,
    dropout,
    budget,
    profile,
    cost,
    dims,
    output,
    force,
    json_out,
    measure,
    estimate,
    schedule,
    grad_accumulation,
    report,
    timestamp,
    quiet,
):
    """Recompute activations of MODEL in the backward pass instead of storing them.

    MODEL is a training graph (.onnx, with forward and gradient nodes) or an onnxruntime-training
    artifacts directory; from a directory the output is a complete artifacts directory. The
    output goes to the current directory unless -o says where; nothing is written over a file
    the command reads, and an existing output is replaced only with --force.

    \b
    Examples:
      onnx-remat apply models/artifacts/blocks10 --scope Block
      onnx-remat apply training_model.onnx --scope 'encoder.layer.*' -o remat.onnx
      onnx-remat apply training_model.onnx --op-type Softmax,Gelu
      onnx-remat apply models/artifacts/blocks10 --scope Block --dropout seed
      onnx-remat apply models/artifacts/blocks10 --budget 60MiB --measure
    """
    dim_values = dims_from(dims)
    out_path, out_is_dir = remat_output(model, output)
    if report is not None and report.suffix.lower() not in (".html", ".htm"):
        raise RematError(f"{report}: the report is an HTML page; give a .html path")
    with outputs({"MODEL": model}, force=force) as outs:
        outs.claim(out_path, "-o", is_dir=out_is_dir)
        outs.claim(report, "--report")
        outs.claim(json_out, "--json")
        if report is not None:
            report_date(timestamp)  # a bad SOURCE_DATE_EPOCH fails now, not after the work
        result = onnx_remat.apply(
            model,
            scopes=scopes,
            op_types=op_types,
            nodes=nodes,
            recompute_outputs=recompute_outputs,
            dims=dim_values,
            check_peak=estimate,
            dropout=dropout,
            schedule=schedule,
            grad_accumulation=grad_accumulation,
            budget=budget,
            profile=resolve_profile(model, cost, profile) if budget is not None else None,
        )
        written = result.save(out_path, force=force)
        summary = {**result.summary(), "output": str(written)}
        if not quiet:
            if result.budget is not None:
                print_budget(result.budget, notes=False)
            if result.rewrite.segments:
                print_apply_summary(result)
            notes = result.plan.notes + result.notes
            if estimate and result.rewrite.segments:
                summary["estimate"], est_notes = print_estimate(result)
                notes += est_notes
            print_notes(notes)
        console.print(f"wrote {written}")
        if report is not None:
            console.print(f"wrote {write_report(result, report, force=force, timestamp=timestamp)}")
        mismatch = False
        if measure:
            from onnx_remat.cli.tables import print_comparison, progress_display
            from onnx_remat.runtime.compare import compare

            with progress_display(console) as progress:
                comparison = compare(model, written, dims=dim_values or None, progress=progress)
            print_comparison(console, comparison)
            summary["measure"] = comparison.to_json()
            mismatch = not comparison.equal
            if result.budget is not None:
                met, line = budget_verdict(comparison, result.budget.budget)
                console.print(line if met else f"[red]{line}[/]")
                summary["measure"]["budget_met"] = met
                mismatch = mismatch or not met
        write_json(summary, json_out, force=force)
    if mismatch:
        ctx.exit(1)


def print_estimate(result) -> tuple[dict | None, list[str]]:
    """Print the static estimate of the planned peak before/after; returns its JSON (None if
    unknown) and its notes, for the caller to print once with apply's own."""
    from onnx_remat.estimate import estimate

    if result.estimate_before is None:
        return None, []  # apply said why in its notes (symbolic dimensions without a value)
    est = estimate(result, scope_table=False)
    before, after = est.before.planned_peak_bytes, est.after.planned_peak_bytes
    console.print(
        f"estimated planned peak (onnxruntime CPU, emulated, nothing run): {format_bytes(before)} -> "
        f"{format_bytes(after)} ({format_ratio(after, before)}); `onnx-remat compare` measures it"
    )
    return {"planned_peak_bytes_before": before, "planned_peak_bytes_after": after, "ratio": est.ratio}, est.notes


def print_apply_summary(result, *, max_segments: int = 30, max_skipped: int = 10) -> None:
    """Per-segment table and skipped segments of an :class:`onnx_remat.ApplyResult` (the caller
    prints the notes, with the estimate's, once each: :func:`onnx_remat.cli.common.print_notes`).

    At most ``max_segments`` rows and ``max_skipped`` skipped segments are printed, then how many
    more (``--json`` has them all): a per-layer rewrite of a deep model has thousands of segments,
    and rich took 1.5 s to lay out the 3,850 rows of one (`benchmarks.apply_scale`'s largest graph)."""
    counts = result.analysis.graph.counts()
    console.print(
        f"[bold]{result.analysis.name}[/]: {counts['nodes']} nodes ({counts['forward_nodes']} forward, "
        f"{counts['backward_nodes']} backward), {counts['stashed_activations']} stashed activations; "
        f"scopes from {result.analysis.scopes.source}"
    )
    table = Table(show_edge=False, header_style="bold")
    table.add_column("segment", overflow="fold")
    table.add_column("cloned", justify="right", no_wrap=True)
    table.add_column("recomputed", justify="right", no_wrap=True)
    table.add_column("released", justify="right", no_wrap=True)
    with_masks = bool(result.plan.masks)
    if with_masks:
        table.add_column("dropout masks", justify="right", no_wrap=True)
    table.add_column("clones wait for (trigger)", overflow="fold")
    segments = result.rewrite.segments
    for seg in segments[:max_segments]:
        s = seg.segment
        released = format_bytes(s.released_bytes) + (f" (+{len(s.unknown_sizes)} unknown)" if s.unknown_sizes else "")
        trigger = ", ".join(seg.triggers) or "-"
        masks = [f"{len(s.masks)}: {format_bytes(s.mask_bytes)}" if s.masks else "-"] if with_masks else []
        table.add_row(seg.label, str(len(seg.clones)), str(len(s.targets)), released, *masks, trigger)
    console.print(table)
    if len(segments) > max_segments:
        console.print(f"[dim]... {len(segments) - max_segments} more segments (all of them in --json)[/]")
    total = format_bytes(result.released_bytes)
    console.print(
        f"{result.clone_count} nodes cloned in {len(result.rewrite.segments)} segments; "
        f"{total} of stored activations released after the forward pass"
    )
    sched = result.schedule
    if sched is not None and sched.changed and sched.chosen is not None:
        console.print(
            f"scheduled ({sched.chosen.label}): the rewrite's estimated planned peak "
            f"{format_bytes(sched.planned_peak_before)} -> {format_bytes(sched.planned_peak_after)}"
        )
    if with_masks:
        console.print(f"dropout masks ({result.dropout}): {mask_summary(result)}")
    skipped_all = result.plan.skipped
    for skipped in skipped_all[:max_skipped]:
        console.print(f"[yellow]skipped[/] {skipped.label}: {skipped.reason}")
    if len(skipped_all) > max_skipped:
        console.print(f"[dim]... {len(skipped_all) - max_skipped} more skipped segments (all of them in --json)[/]")


def mask_summary(result) -> str:
    """What the replayed dropout masks cost in storage, in words."""
    n = len(result.plan.masks)
    stored = format_bytes(result.mask_bytes)
    if result.dropout == "seed":
        return f"{n} masks, none stored (drawn again from seeds: another random stream than the original's)"
    if result.dropout == "byte":
        return f"{n} masks stored at one byte per element, {stored}"
    packed = len(result.rewrite.packed_masks)
    kept = n - packed
    return f"{n} masks stored in {stored}: {packed} at one bit per element" + (f", {kept} at one byte" if kept else "")
