"""Option groups and printing helpers shared by the subcommands, so flags mean the same everywhere."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import click
from rich.console import Console

from onnx_remat.model_io import output_session, write_file
from onnx_remat.units import parse_dims, parse_int_range

# Width of output that is not a terminal (a pipe, a file, a CI log), where COLUMNS is not set:
# wide enough that no table cell or note wraps (rich would draw 80 columns and break scope names
# mid-word). A terminal gets its own width; COLUMNS, when set, wins everywhere.
PIPE_WIDTH = 1000


def output_width(stream) -> int | None:
    """The width to draw for ``stream``: None (rich's choice: the terminal's width, or COLUMNS) for a
    terminal or when COLUMNS is set, else :data:`PIPE_WIDTH`."""
    if os.environ.get("COLUMNS", "").strip().isdigit():
        return None
    try:
        if stream.isatty():
            return None
    except (AttributeError, ValueError):  # a closed or replaced stream
        pass
    return PIPE_WIDTH


console = Console(highlight=False, width=output_width(sys.stdout))
# printed under a table with "+N?" in a bytes column
UNKNOWN_LEGEND = "+N?: N more tensors whose size shape inference could not tell, not counted in the bytes"
err_console = Console(stderr=True, highlight=False, width=output_width(sys.stderr))


class Tolerance(click.ParamType):
    """A finite number >= 0 (click's FloatRange lets ``nan`` and ``inf`` through)."""

    name = "float"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            return value
        try:
            x = float(str(value).strip())
        except ValueError:
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(x) or x < 0:
            self.fail(f"{value!r} is not a finite number >= 0", param, ctx)
        return x


def model_argument(f):
    return click.argument("model", type=click.Path(path_type=Path))(f)


def dims_option(f):
    return click.option(
        "--dim",
        "dims",
        multiple=True,
        metavar="NAME=VALUE",
        help="Bind a symbolic dimension (repeatable), e.g. --dim batch=8.",
    )(f)


def force_option(f):
    return click.option(
        "--force", is_flag=True, help="Replace output files that exist (never a file the command reads)."
    )(f)


def outputs(inputs: dict, *, force: bool = False):
    """The output session of a command (:func:`onnx_remat.model_io.output_session`): ``inputs``
    (``{"MODEL": path, "--order": path}``) are never written; outputs are claimed up front with
    ``.claim(path, "--json")`` and removed again if the command fails or is interrupted."""
    return output_session(inputs, force=force)


def json_option(f):
    return click.option(
        "--json",
        "json_out",
        type=click.Path(path_type=Path),
        metavar="OUT",
        help="Also write the result as JSON to OUT ('-' for stdout).",
    )(f)


def selection_options(f):
    """--scope / --op-type / --node / --recompute-outputs, as apply and estimate take them."""
    f = click.option(
        "--recompute-outputs",
        is_flag=True,
        help="When a recomputed scope feeds the next one, do not store its output either: merge them "
        "(MindSpore's output_recompute).",
    )(f)
    f = click.option(
        "--node", "nodes", multiple=True, metavar="NAME", help="Recompute this node's outputs (repeatable)."
    )(f)
    f = click.option(
        "--op-type",
        "op_types",
        multiple=True,
        metavar="OPS",
        help="Recompute outputs of these op types, e.g. Softmax,Gelu.",
    )(f)
    f = click.option(
        "--scope",
        "scopes",
        multiple=True,
        metavar="PATTERN",
        help=(
            "Recompute each matching scope instance: module path, glob (blocks.*) or class name (Block); "
            "a module run more than once has a scope per call (layer@1, layer@2, ...)."
        ),
    )(f)
    return f


def dropout_option(f):
    """--dropout {packed,seed,byte}: how a recomputed Dropout gets its mask back (apply, estimate)."""
    return click.option(
        "--dropout",
        type=click.Choice(["packed", "seed", "byte"]),
        default="packed",
        show_default=True,
        help="How recomputed dropout gets its mask: packed stores it at 1 bit per element (bit-identical); "
        "seed stores none and draws again from a seed (same masks, but another random stream than the "
        "original's); byte stores it as it is.",
    )(f)


def dims_from(items) -> dict[str, int]:
    return parse_dims(list(items))


def write_json(data, out: Path | None, *, force: bool = False) -> None:
    """Write ``data`` as JSON to ``out`` atomically ('-' prints it); an existing file needs ``force``."""
    if out is None:
        return
    text = json.dumps(data, indent=2, sort_keys=False, default=str) + "\n"
    if str(out) == "-":
        click.echo(text, nl=False)
        return
    write_file(out, text, force=force)


def merge_notes(notes: list[str]) -> list[str]:
    """Each note once; ``before: X`` and ``after: X`` become ``before and after: X``."""
    out: list[str] = []
    for note in notes:
        if note.startswith("after: ") and f"before: {note[7:]}" in notes:
            continue
        if note.startswith("before: ") and f"after: {note[8:]}" in notes:
            note = "before and after: " + note[8:]
        if note not in out:
            out.append(note)
    return out


def print_notes(notes: list[str], out: Console | None = None) -> None:
    """Print notes once each (:func:`merge_notes`)."""
    for note in merge_notes(list(notes)):
        (out or console).print(f"[dim]note:[/] {note}")


def parse_int_ranges(items) -> dict[str, tuple[int, int]]:
    """``('input_ids=0:512', 'labels=10')`` -> ``{'input_ids': (0, 512), 'labels': (0, 10)}`` (high excluded)."""
    return dict(parse_int_range(item) for item in items)


def json_safe(obj):
    """NaN and infinities as strings, so the JSON file stays valid JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [json_safe(v) for v in obj]
    return obj


def run_options(*, steps: int | None = 3, steps_help: str = "Timed training steps.", live: bool = True):
    """Options of the commands that run a graph (measure, compare, check), with their defaults.

    The same flags mean the same in every command; ``steps`` and ``live`` are the defaults that
    differ (``check`` runs one step and skips the live peak unless asked).
    """
    options = [
        click.option(
            "--device",
            type=click.Choice(["cpu", "cuda"]),
            default="cpu",
            show_default=True,
            help="Run on cpu, or on cuda (needs onnx-remat[cuda] and an NVIDIA GPU).",
        ),
        click.option(
            "--steps", type=click.IntRange(min=1), default=steps, show_default=steps is not None, help=steps_help
        ),
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
            "--seed",
            type=click.IntRange(0, 2**31 - 1),
            default=0,
            show_default=True,
            help="Seed of synthesized inputs and of dropout.",
        ),
        click.option("--live/--no-live", default=live, show_default=True, help="Measure the live peak (RSS, CPU) too."),
        json_option,
        force_option,
    ]

    def decorate(f):
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def run_inputs(options: dict) -> dict:
    """The files a run reads besides the model (``--inputs``, ``--checkpoint``), for :func:`outputs`."""
    return {"--inputs": options.get("inputs"), "--checkpoint": options.get("checkpoint")}


def run_kwargs(device, steps, warmup, dims, inputs, int_ranges, checkpoint, seed, live) -> dict:
    """The keyword arguments of measure()/compare()/check() from :func:`run_options`."""
    return dict(
        device=device,
        steps=steps,
        warmup=warmup,
        dims=dims_from(dims),
        inputs=inputs,
        int_ranges=parse_int_ranges(int_ranges),
        checkpoint=checkpoint,
        seed=seed,
        live=live,
    )
