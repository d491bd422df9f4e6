"""``onnx-remat measure MODEL``: run a training graph with onnxruntime-training and report its
planned, arena and live memory peaks, step time and loss (and, for a rewritten graph, which
recompute nodes onnxruntime kept and when they ran). The work is
:func:`onnx_remat.runtime.measure.measure`; this module parses, calls and prints.
"""

from __future__ import annotations

import math

import click

from onnx_remat.errors import UsageError

from .common import console, dims_from, dims_option, err_console, json_option, model_argument, write_json


def parse_int_ranges(items) -> dict[str, tuple[int, int]]:
    """``('input_ids=0:512', 'labels=10')`` -> ``{'input_ids': (0, 512), 'labels': (0, 10)}`` (high excluded)."""
    out: dict[str, tuple[int, int]] = {}
    for item in items:
        name, sep, value = item.partition("=")
        low, colon, high = value.partition(":")
        try:
            rng = (int(low), int(high)) if colon else (0, int(low))
        except ValueError:
            rng = None
        if not sep or not name.strip() or rng is None:
            raise UsageError(f"--int-range takes name=low:high (high excluded) or name=high, got {item!r}")
        out[name.strip()] = rng
    return out


def json_safe(obj):
    """NaN and infinities as strings, so the JSON file stays valid JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [json_safe(v) for v in obj]
    return obj


def run_options(f):
    """Options measure and compare share."""
    options = [
        click.option(
            "--device",
            type=click.Choice(["cpu", "cuda"]),
            default="cpu",
            show_default=True,
            help="Run on cpu, or on cuda (needs onnx-remat[cuda] and an NVIDIA GPU).",
        ),
        click.option("--steps", type=click.IntRange(min=1), default=3, show_default=True, help="Timed training steps."),
        click.option(
            "--warmup",
            type=click.IntRange(min=1),
            default=1,
            show_default=True,
            help="Untimed steps before them (the first one is profiled).",
        ),
        dims_option,
        click.option(
            "--inputs",
            type=click.Path(dir_okay=False),
            default=None,
            metavar="DATA.npz",
            help="Data inputs (numpy.savez, one array per graph input) instead of synthesized ones.",
        ),
        click.option(
            "--int-range",
            "int_ranges",
            multiple=True,
            metavar="NAME=LOW:HIGH",
            help="Values [LOW, HIGH) of a synthesized integer input such as token ids (repeatable).",
        ),
        click.option(
            "--checkpoint",
            type=click.Path(),
            default=None,
            help="Parameters from this checkpoint (default: the artifacts directory's).",
        ),
        click.option(
            "--seed", type=int, default=0, show_default=True, help="Seed of synthesized inputs and of dropout."
        ),
        click.option("--no-live", is_flag=True, help="Skip the live-peak (RSS) run."),
        json_option,
    ]
    for option in reversed(options):
        f = option(f)
    return f


def run_kwargs(device, steps, warmup, dims, inputs, int_ranges, checkpoint, seed, no_live) -> dict:
    """The keyword arguments of measure()/compare() from the shared options."""
    return dict(
        device=device,
        steps=steps,
        warmup=warmup,
        dims=dims_from(dims),
        inputs=inputs,
        int_ranges=parse_int_ranges(int_ranges),
        checkpoint=checkpoint,
        seed=seed,
        live=not no_live,
    )


@click.command("measure")
@model_argument
@run_options
def command(model, json_out, **options):
    """Measure training steps of MODEL (a training graph or artifacts directory) with onnxruntime.

    Reports the planned activation peak (the memory-pattern block of a step), the peak of an
    exact-growth arena, the live peak (RSS growth in a step, CPU), the step time and the loss.
    Each comes from a fresh process; synthesized inputs and dropout are seeded.

    \b
    Examples:
      onnx-remat measure models/artifacts/blocks10
      onnx-remat measure training_model.onnx --dim batch=8 --int-range input_ids=0:50257
    """
    from onnx_remat.runtime.measure import measure
    from onnx_remat.runtime.report import progress_display, render_measurement

    to_stdout = json_out is not None and str(json_out) == "-"
    out = err_console if to_stdout else console
    with progress_display(out) as progress:
        m = measure(model, progress=progress, **run_kwargs(**options))
    if not to_stdout:
        out.print(render_measurement(m))
    write_json(json_safe(m.to_json()), json_out)
