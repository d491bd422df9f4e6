"""``onnx-remat scopes``: the scope tree of a training graph, with what each scope stores."""

from __future__ import annotations

import click
from rich.table import Table

from onnx_remat.analysis.model import analyze_model
from onnx_remat.analysis.scope_table import scope_report
from onnx_remat.cli.common import (
    console,
    dims_from,
    dims_option,
    force_option,
    json_option,
    model_argument,
    outputs,
    write_json,
)
from onnx_remat.units import format_bytes


@click.command("scopes")
@model_argument
@dims_option
@click.option(
    "--depth", type=click.IntRange(min=0), default=None, help="Show scopes down to this depth (0: top level)."
)
@json_option
@force_option
def scopes_cmd(model, dims, depth, json_out, force):
    """Print the scope tree of MODEL's forward nodes.

    Per scope: forward nodes, bytes of activations it stashes for the backward pass, and the stored
    bytes that recomputing it (--scope PATH) would release; repeated layers are marked.
    """
    with outputs({"MODEL": model}, force=force) as outs:
        outs.claim(json_out, "--json")
        _scopes(model, dims, depth, json_out, force)


def _scopes(model, dims, depth, json_out, force) -> None:
    analysis = analyze_model(model, dims=dims_from(dims))
    report = scope_report(analysis, max_depth=depth)
    table = Table(show_edge=False, header_style="bold")
    table.add_column("scope", overflow="fold")
    table.add_column("class", overflow="fold")
    table.add_column("nodes", justify="right", no_wrap=True)
    table.add_column("stashed", justify="right", no_wrap=True)
    table.add_column("recompute releases", justify="right", no_wrap=True)
    table.add_column("repeated", overflow="fold")
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
    if report.suggestions:
        best = report.suggestions[0]
        what = best["pattern"] if best["class"] else "same structure"
        console.print(
            f"repeated: {best['scopes'][0]} .. {best['scopes'][-1]} ({best['count']} x {what}) "
            f"-> try --scope {_shell_word(best['pattern'])}"
        )
    if any(r.stashed_unknown or r.releasable_unknown for r in report.rows):
        why = (
            f"bind {', '.join(report.unknown_symbols)} with --dim name=value"
            if report.unknown_symbols
            else "shape inference could not tell their shapes"
        )
        console.print(f"+N?: N more tensors of unknown size, not counted in the bytes ({why})")
    elif report.unknown_symbols:
        console.print(
            "[yellow]sizes depend on unbound dimensions[/] "
            + ", ".join(report.unknown_symbols)
            + ": give --dim name=value"
        )
    write_json(report.to_json(), json_out, force=force)


def _shell_word(text: str) -> str:
    """``text`` as it must be typed in a shell: quoted when it has glob characters."""
    return f"'{text}'" if any(c in text for c in "*?[]") else text
