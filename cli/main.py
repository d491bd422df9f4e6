"""The ``onnx-remat`` command: a click group whose subcommands live one per module in this package.

The click layer only parses arguments, calls a function of :mod:`onnx_remat` and prints the
result. Errors a user can fix arrive as :class:`onnx_remat.errors.RematError` and are printed as
one line (``error: ...``) with the error's exit status (1 bad input or failed check, 2 usage,
3 environment); no traceback unless ``--debug`` is given.
"""

from __future__ import annotations

import click

from onnx_remat import __version__
from onnx_remat.errors import RematError


def _one_line(exc: BaseException) -> str:
    """The message on one line, whatever the library put in it."""
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__


class _Group(click.Group):
    """A click group that turns library errors into one line and an exit status.

    Signals (KeyboardInterrupt, :class:`onnx_remat.interrupts.Interrupted`) and a closed stdout
    pipe pass through to the console script (:mod:`onnx_remat.cli.entry`), which prints one
    word and exits.
    """

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except RematError as exc:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"error: {_one_line(exc)}", err=True)
            ctx.exit(exc.exit_code)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort, BrokenPipeError):
            raise
        except MemoryError:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo("error: out of memory (smaller --dim values, or a machine with more memory)", err=True)
            ctx.exit(3)
        except Exception as exc:  # a bug in onnx-remat: still one line, traceback on --debug
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(
                f"internal error: {type(exc).__name__}: {_one_line(exc)} "
                "(rerun with --debug for the traceback, and please report it)",
                err=True,
            )
            ctx.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="onnx-remat")
@click.option("--debug", is_flag=True, help="Show Python tracebacks for errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Recompute activations in ONNX training graphs to cut training memory.

    Typical use: `onnx-remat scopes MODEL` to see the scope tree, then
    `onnx-remat apply MODEL --scope Block` to write the rewritten graph.
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def _register() -> None:
    # One module per subcommand; importing them here keeps `main` the single entry point that
    # pyproject's console script names. Heavy imports (onnxruntime, matplotlib) stay inside the
    # commands, so `onnx-remat --help` is fast.
    from onnx_remat.cli import apply, check, compare, estimate, measure, report, scopes, viz

    for command in (
        scopes.scopes_cmd,
        apply.apply_cmd,
        estimate.command,
        measure.command,
        compare.command,
        check.command,
        viz.command,
        report.command,
    ):
        main.add_command(command)


_register()


if __name__ == "__main__":  # pragma: no cover
    from onnx_remat.cli.entry import main as entry

    entry()
