"""``onnx-remat measure MODEL``: run a training graph with onnxruntime-training and report its
planned, arena and live memory peaks, step time and loss (and, for a rewritten graph, which
recompute nodes onnxruntime kept and when they ran). The work is
:func:`onnx_remat.runtime.measure.measure`; this module parses, calls and prints.
"""

from __future__ import annotations

import click

from onnx_remat.cli.common import (
    console,
    err_console,
    json_safe,
    model_argument,
    outputs,
    run_inputs,
    run_kwargs,
    run_options,
    write_json,
)


@click.command("measure")
@model_argument
@run_options()
def command(model, json_out, force, **options):
    """Measure training steps of MODEL (a training graph or artifacts directory) with onnxruntime.

    Reports the planned activation peak (the memory-pattern block of a step), the peak of an
    exact-growth arena, the live peak (RSS growth in a step, CPU), the step time and the loss.
    Each comes from a fresh process; synthesized inputs and dropout are seeded.

    \b
    Examples:
      onnx-remat measure models/artifacts/blocks10
      onnx-remat measure training_model.onnx --dim batch=8 --int-range input_ids=0:50257
    """
    from onnx_remat.cli.tables import progress_display, render_measurement
    from onnx_remat.runtime.measure import measure

    to_stdout = json_out is not None and str(json_out) == "-"
    out = err_console if to_stdout else console
    with outputs({"MODEL": model, **run_inputs(options)}, force=force) as outs:
        outs.claim(json_out, "--json")
        kwargs = run_kwargs(**options)
        with progress_display(out) as progress:
            m = measure(model, progress=progress, **kwargs)
        if not to_stdout:
            out.print(render_measurement(m))
        write_json(json_safe(m.to_json()), json_out, force=force)
