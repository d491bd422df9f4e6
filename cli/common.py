"""Option groups and printing helpers shared by the subcommands, so flags mean the same everywhere."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import click
from rich.console import Console

from onnx_remat.errors import RematError
from onnx_remat.units import parse_dims

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


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
    f = click.option("--node", "nodes", multiple=True, metavar="NAME", help="Recompute this node's outputs (repeatable).")(f)
    f = click.option(
        "--op-type", "op_types", multiple=True, metavar="OPS", help="Recompute outputs of these op types, e.g. Softmax,Gelu."
    )(f)
    f = click.option(
        "--scope",
        "scopes",
        multiple=True,
        metavar="PATTERN",
        help="Recompute each matching scope instance: module path, glob (blocks.*) or class name (Block).",
    )(f)
    return f


def dims_from(items) -> dict[str, int]:
    return parse_dims(list(items))


def write_json(data, out: Path | None) -> None:
    """Write ``data`` as JSON to ``out`` atomically ('-' prints it)."""
    if out is None:
        return
    text = json.dumps(data, indent=2, sort_keys=False, default=str) + "\n"
    if str(out) == "-":
        click.echo(text, nl=False)
        return
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, out)
    except OSError as exc:
        raise RematError(f"{out}: cannot write ({exc.strerror})") from None
