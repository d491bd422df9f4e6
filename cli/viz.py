"""``onnx-remat viz``: a picture of a training graph and of what the recompute rewrite changes."""

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
    print_notes,
    selection_options,
)
from onnx_remat.errors import RematError
from onnx_remat.show.graph_view import FORMATS, graph_view, graphviz_available, write_graph


@click.command("viz")
@model_argument
@selection_options
@dims_option
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    required=True,
    metavar="OUT.{dot,svg,png,html}",
    help="Where to write: .dot (DOT text, always), .svg / .png (needs Graphviz's dot), .html (the SVG in "
    "a self-contained page; DOT text with a note when Graphviz is missing).",
)
@click.option(
    "--focus",
    multiple=True,
    metavar="PATTERN",
    help="Scope instances to draw in full (default: the first --expand selected ones).",
)
@click.option(
    "--expand",
    type=click.IntRange(min=0),
    default=2,
    show_default=True,
    help="How many selected scope instances to draw in full when --focus is not given.",
)
@click.option("--before", is_flag=True, help="Draw the graph before the rewrite, with the edges it replaces in red.")
@force_option
def command(model, scopes, op_types, nodes, recompute_outputs, dims, output, focus, expand, before, force):
    """Draw MODEL's graph around the recomputed scopes.

    Forward, backward, cloned and barrier nodes have their own colours, each drawn scope instance
    is a cluster and the edges the rewrite changed are bold. Other scopes are collapsed into one
    box each (runs of the same class into one box) with the activation bytes they store; the
    command says what it collapsed.

    \b
    Examples:
      onnx-remat viz models/artifacts/blocks10 --scope Block -o blocks10_after.svg
      onnx-remat viz models/artifacts/blocks10 --scope Block --before -o blocks10_before.png
      onnx-remat viz training_model.onnx --scope 'encoder.layer.*' --focus encoder.layer.3 -o view.html
    """
    if output.suffix.lower() not in FORMATS:
        raise RematError(
            f"{output}: cannot write a {output.suffix or 'suffix-less'} graph; give a .dot, .svg, .png or .html path"
        )
    if before and not (scopes or op_types or nodes):
        raise RematError("--before needs a selection (--scope, --op-type or --node) to show what it replaces")
    with outputs({"MODEL": model}, force=force) as outs:
        outs.claim(output, "-o")
        view = graph_view(
            model,
            scopes=scopes,
            op_types=op_types,
            nodes=nodes,
            recompute_outputs=recompute_outputs,
            focus=focus,
            expand=expand,
            before=before,
            dims=dims_from(dims),
        )
        written = write_graph(view, output, force=force)
        shown = ", ".join(view.clusters) or "none"
        console.print(f"{view.title}: drew {shown} in full, {len(view.nodes)} items, {len(view.edges)} edges")
        if view.collapsed:
            console.print("collapsed: " + "; ".join(view.collapsed))
        print_notes(view.notes)
        if output.suffix.lower() == ".html" and not graphviz_available():
            console.print(
                "[yellow]Graphviz's dot is not installed: the page holds the DOT text instead of a picture[/]"
            )
        console.print(f"wrote {written}")
