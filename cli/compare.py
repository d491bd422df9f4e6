"""``onnx-remat compare A B``: measure two training graphs side by side (B/A ratios) and check that
they compute the same loss and gradients; exit status 1 when they do not. The work is
:func:`onnx_remat.runtime.compare.compare`; this module parses, calls and prints.
"""

from __future__ import annotations

from pathlib import Path

import click

from onnx_remat.cli.common import (
    Tolerance,
    console,
    err_console,
    json_safe,
    outputs,
    run_inputs,
    run_kwargs,
    run_options,
    write_json,
)


@click.command("compare")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option(
    "--atol",
    type=Tolerance(),
    default=0.0,
    show_default=True,
    help="Absolute tolerance (with --rtol 0 as well: bit for bit).",
)
@click.option("--rtol", type=Tolerance(), default=0.0, show_default=True, help="Relative tolerance.")
@run_options()
@click.pass_context
def command(ctx, a, b, atol, rtol, json_out, force, **options):
    """Compare training graphs A (e.g. the original) and B (e.g. its rewrite).

    Both run with the same inputs, parameters and seed. Prints their memory peaks and step times
    with B/A ratios, then PASSED when the loss and every gradient of one step are equal (bit for
    bit unless --atol/--rtol), else FAILED with exit status 1.

    \b
    Example:
      onnx-remat compare models/artifacts/blocks10 models/artifacts/blocks10_remat
    """
    from onnx_remat.cli.tables import print_comparison, progress_display, verdict
    from onnx_remat.runtime.compare import compare

    to_stdout = json_out is not None and str(json_out) == "-"
    out = err_console if to_stdout else console
    with outputs({"A": a, "B": b, **run_inputs(options)}, force=force) as outs:
        outs.claim(json_out, "--json")
        kwargs = run_kwargs(**options)
        with progress_display(out) as progress:
            c = compare(a, b, atol=atol, rtol=rtol, progress=progress, **kwargs)
        if to_stdout:
            out.print(verdict(c), soft_wrap=True)
        else:
            print_comparison(out, c)
        write_json(json_safe(c.to_json()), json_out, force=force)
    if not c.equal:
        ctx.exit(1)
