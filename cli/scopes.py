"""``onnx-remat scopes``: the scope tree of a training graph, with what each scope stores."""

from __future__ import annotations

import click
from rich.table import Table

from onnx_remat.analysis.model import analyze_model
from onnx_remat.analysis.scope_table import scope_report
from onnx_remat.cli.common import console, dims_from, dims_option, json_option, model_argument, write_json
from onnx_remat.units import format_bytes


@click.command("scopes")
@model_argument
@dims_option
@click.option(
    "--depth", type=click.IntRange(min=0), default=None, help="Show scopes down to this depth (0: top level)."
)
@json_option
def scopes_cmd(model, dims, depth, json_out):
    """Print the scope tree of MODEL's forward nodes.

    Per scope: forward nodes, bytes of activations it stashes for the backward pass, and the stored
    bytes that recomputing it (--scope PATH) would release; repeated layers are marked.
    """
    analysis = analyze_model(model, dims=dims_from(dims))
    report = scope_report(analysis, max_depth=depth)
    table = Table(show_edge=False, header_style="bold")
    table.add_column("scope")
    table.add_column("class")
    table.add_column("nodes", justify="right")
    table.add_column("stashed", justify="right")
    table.add_column("recompute releases", justify="right")
    table.add_column("repeated")
    for row in report.rows:
        stashed = format_bytes(row.stashed_bytes) + (f" +{row.stashed_unknown}?" if row.stashed_unknown else "")
        releases = format_bytes(row.releasable_bytes) + (
            f" +{row.releasable_unknown}?" if row.releasable_unknown else ""
        )
        table.add_row(
            "  " * row.depth + row.path,
            (row.class_name or "").rsplit(".", 1)[-1],
            str(row.nodes),
            stashed,
            releases,
            row.repeated or "",
        )
    console.print(f"[bold]{report.model}[/]: scopes from {report.source}")
    console.print(table)
    console.print(f"stashed activations in all: {format_bytes(report.total_stashed_bytes)}")
    for group in report.repeated_groups:
        cls = (group["class"] or "").rsplit(".", 1)[-1]
        if len(group["scopes"]) > 2:
            console.print(
                f"repeated: {group['scopes'][0]} .. {group['scopes'][-1]} "
                f"({group['count']} x {cls or 'same structure'})" + (f" -> try --scope {cls}" if cls else "")
            )
    if report.unknown_symbols:
        console.print(
            "[yellow]sizes depend on unbound dimensions[/] "
            + ", ".join(report.unknown_symbols)
            + ": give --dim name=value ('?' marks tensors of unknown size)"
        )
    write_json(report.to_json(), json_out)
