"""``onnx-remat estimate``: activation memory of one training step, before and after a rewrite."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from onnx_remat.cli.common import (
    UNKNOWN_LEGEND,
    console,
    dims_from,
    dims_option,
    dropout_option,
    force_option,
    json_option,
    model_argument,
    outputs,
    print_notes,
    selection_options,
    write_json,
)
from onnx_remat.errors import RematError
from onnx_remat.estimate import estimate
from onnx_remat.runtime.kept import check_order_matched, read_execution_order
from onnx_remat.units import format_bytes, format_ratio


@click.command("estimate")
@model_argument
@selection_options
@dropout_option
@dims_option
@json_option
@click.option(
    "--plot",
    "plot_out",
    type=click.Path(path_type=Path),
    metavar="OUT.png|OUT.svg",
    help="Also write the memory timeline (before/after) as a PNG or SVG picture.",
)
@click.option(
    "--order",
    "order_file",
    type=click.Path(path_type=Path),
    metavar="PROFILE.json",
    help="Use the execution order onnxruntime really ran (its profile JSON, or a JSON list of node "
    "names) for the graph as given, instead of the emulated DEFAULT order.",
)
@click.option(
    "--depth", type=click.IntRange(min=0), default=0, show_default=True, help="Scope table down to this depth."
)
@click.option(
    "--top",
    type=click.IntRange(min=0),
    default=8,
    show_default=True,
    help="How many of the tensors alive at the peak to list.",
)
@force_option
def command(
    model, scopes, op_types, nodes, recompute_outputs, dropout, dims, json_out, plot_out, order_file, depth, top, force
):
    """Estimate the activation memory of one training step of MODEL, without running it.

    The planned peak is the block onnxruntime 1.19 (CPU) allocates for a step's activations:
    its graph rewrites, execution order and memory planner are emulated. With --scope /
    --op-type / --node the recompute rewrite is applied in memory (nothing is written) and
    estimated too.

    \b
    Examples:
      onnx-remat estimate models/artifacts/blocks10
      onnx-remat estimate models/artifacts/blocks10 --scope Block --plot timeline.png
      onnx-remat estimate training_model.onnx --dim batch=8 --json est.json
    """
    if plot_out is not None and plot_out.suffix.lower() not in (".png", ".svg"):
        raise RematError(
            f"{plot_out}: cannot write a {plot_out.suffix or 'suffix-less'} plot; give a .png or .svg path"
        )
    with outputs({"MODEL": model, "--order": order_file}, force=force) as outs:
        outs.claim(json_out, "--json")
        outs.claim(plot_out, "--plot")
        order = read_execution_order(order_file) if order_file else None
        result = estimate(
            model,
            scopes=scopes,
            op_types=op_types,
            nodes=nodes,
            recompute_outputs=recompute_outputs,
            dropout=dropout,
            dims=dims_from(dims),
            execution_order=order,
        )
        if order is not None:
            check_order_matched(result.before, order_file, len(order))
        print_estimate(result, depth=depth, top=top)
        if plot_out is not None:
            from onnx_remat.show.timeline import plot_timeline

            written = plot_timeline(result, plot_out, force=force)
            console.print(f"wrote {written}")
        write_json(result.to_json(), json_out, force=force)


def print_estimate(result, *, depth: int = 0, top: int = 8, max_scopes: int = 30) -> None:
    """The summary table, the tensors alive at the peak, the scope table and the notes."""
    before, after = result.before, result.after
    rewrites = ", ".join(f"{v} {k}" for k, v in sorted(before.runtime_rewrites.items(), key=lambda kv: -kv[1]))
    console.print(
        f"[bold]{result.model}[/]: onnxruntime runs {len(before.steps)} nodes"
        + (f" after its rewrites ({rewrites})" if rewrites else "")
        + f"; order: {before.order_source}"
    )
    table = Table(show_edge=False, header_style="bold")
    table.add_column("")
    table.add_column("planned peak", justify="right", no_wrap=True)
    table.add_column("live peak", justify="right", no_wrap=True)
    table.add_column("outside block", justify="right", no_wrap=True)
    table.add_column("peak at", overflow="fold")
    rows = [("before", before)] + ([("after", after)] if after is not None else [])
    for label, est in rows:
        table.add_row(
            label,
            format_bytes(est.planned_peak_bytes),
            format_bytes(est.peak_live_bytes),
            format_bytes(est.outside_block_bytes) if est.outside_block else "-",
            f"step {est.peak_step + 1}/{len(est.steps)} {est.peak_node} ({est.peak_region})",
        )
    console.print(table)
    if after is not None:
        sel = result.selection or {}
        masks = sum(len(s.get("masks", [])) for s in result.segments or [])
        mask_words = f"; {masks} dropout masks, {format_bytes(sel.get('mask_bytes', 0))} stored ({sel.get('dropout')})"
        console.print(
            f"after/before: [bold]{format_ratio(after.planned_peak_bytes, before.planned_peak_bytes)}[/] "
            f"({sel.get('cloned_nodes', 0)} nodes cloned in {sel.get('segments', 0)} segments"
            + (mask_words if masks else "")
            + ")"
        )
    if top:
        for label, est in rows:
            console.print(f"largest tensors alive at the {label} peak:")
            for t in est.live_at_peak[:top]:
                where = ", ".join(x for x in (t.scope, t.region) if x)
                console.print(f"  {format_bytes(t.bytes):>10}  {t.tensor}  [dim]({where})[/]")
            more = len(est.live_at_peak) - top
            if more > 0:
                console.print(
                    f"  [dim]... {more} more ({format_bytes(sum(t.bytes for t in est.live_at_peak[top:]))})[/]"
                )
    scope_rows = [s for s in result.scopes if s.depth <= depth]
    hidden = max(0, len(scope_rows) - max_scopes)
    scope_rows = scope_rows[:max_scopes]
    if scope_rows:
        st = Table(show_edge=False, header_style="bold")
        st.add_column("scope", overflow="fold")
        st.add_column("class", overflow="fold")
        st.add_column("stored", justify="right", no_wrap=True)
        st.add_column("recompute releases", justify="right", no_wrap=True)
        st.add_column("alive at the peak", justify="right", no_wrap=True)
        for s in scope_rows:
            stored = format_bytes(s.stored_bytes) + (f" +{s.stored_unknown}?" if s.stored_unknown else "")
            st.add_row(
                "  " * s.depth + s.path,
                (s.class_name or "").rsplit(".", 1)[-1],
                stored,
                format_bytes(s.releasable_bytes),
                format_bytes(s.live_at_peak_bytes),
            )
        console.print(st)
        if hidden:
            console.print(f"[dim]... {hidden} more scopes (all of them in --json)[/]")
        if any(s.stored_unknown for s in scope_rows):
            console.print(UNKNOWN_LEGEND)
    for s in result.skipped:
        console.print(f"[yellow]skipped[/] {s['label']}: {s['reason']}")
    print_notes(result.notes)
