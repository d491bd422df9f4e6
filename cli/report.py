"""``onnx-remat report``: one self-contained HTML page about a recompute rewrite."""

from __future__ import annotations

from pathlib import Path

import click

from onnx_remat.cli.common import (
    console,
    dims_from,
    dims_option,
    force_option,
    model_argument,
    outputs,
    selection_options,
)
from onnx_remat.errors import RematError
from onnx_remat.runtime.kept import read_execution_order
from onnx_remat.show.report import report_date, write_report


@click.command("report")
@model_argument
@selection_options
@dims_option
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    required=True,
    metavar="OUT.html",
    help="Where to write the page.",
)
@click.option("--focus", multiple=True, metavar="PATTERN", help="Scope instances to draw in full in the graph.")
@click.option(
    "--expand",
    type=click.IntRange(min=0),
    default=2,
    show_default=True,
    help="How many selected scope instances to draw in full when --focus is not given.",
)
@click.option(
    "--order",
    "order_file",
    type=click.Path(path_type=Path),
    metavar="PROFILE.json",
    help="Execution order onnxruntime really ran for MODEL (profile JSON or a JSON list of node names).",
)
@click.option("--title", help="Page title.")
@click.option(
    "--timestamp",
    is_flag=True,
    help="Put the date in the page (default: none, so the same input gives the same bytes; "
    "SOURCE_DATE_EPOCH sets the date).",
)
@force_option
def command(
    model, scopes, op_types, nodes, recompute_outputs, dims, output, focus, expand, order_file, title, timestamp, force
):
    """Write an HTML report of recomputing the selected activations of MODEL.

    Summary (estimated planned peak before/after), memory timeline, per-scope table, segments,
    largest tensors alive at the peaks and the graph of the rewritten region, in one file that
    opens anywhere. Nothing else is written.

    \b
    Example:
      onnx-remat report models/artifacts/blocks10 --scope Block -o blocks10_report.html
    """
    if output.suffix.lower() not in (".html", ".htm"):
        raise RematError(f"{output}: the report is an HTML page; give a .html path")
    with outputs({"MODEL": model, "--order": order_file}, force=force) as outs:
        outs.claim(output, "-o")
        report_date(timestamp)  # a bad SOURCE_DATE_EPOCH fails before the work
        written = write_report(
            model,
            output,
            scopes=scopes,
            op_types=op_types,
            nodes=nodes,
            recompute_outputs=recompute_outputs,
            dims=dims_from(dims),
            focus=focus,
            expand=expand,
            title=title,
            execution_order=read_execution_order(order_file) if order_file else None,
            force=force,
            timestamp=timestamp,
        )
        console.print(f"wrote {written}")
