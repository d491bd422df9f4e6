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

# One module per subcommand, imported when that subcommand runs (each pulls in onnx, numpy and
# rich; only the one asked for is loaded, which keeps every command's start-up short). The order
# is the order of `onnx-remat -h`.
_COMMANDS = {
    "scopes": ("onnx_remat.cli.scopes", "scopes_cmd"),
    "apply": ("onnx_remat.cli.apply", "apply_cmd"),
    "schedule": ("onnx_remat.cli.schedule", "command"),
    "plan": ("onnx_remat.cli.plan", "command"),
    "estimate": ("onnx_remat.cli.estimate", "command"),
    "measure": ("onnx_remat.cli.measure", "command"),
    "compare": ("onnx_remat.cli.compare", "command"),
    "check": ("onnx_remat.cli.check", "command"),
    "viz": ("onnx_remat.cli.viz", "command"),
    "report": ("onnx_remat.cli.report", "command"),
}


def _one_line(exc: BaseException) -> str:
    """The message on one line, whatever the library put in it."""
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__


class _Group(click.Group):
    """A click group that turns library errors into one line and an exit status.

    Signals (KeyboardInterrupt, :class:`onnx_remat.interrupts.Interrupted`) and a closed stdout
    pipe pass through to the console script (:mod:`onnx_remat.cli.entry`), which prints one
    word and exits.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The subcommand, its module imported on first use."""
        if cmd_name not in self.commands and cmd_name in _COMMANDS:
            import importlib

            from onnx_remat.interrupts import critical

            module, attr = _COMMANDS[cmd_name]
            # A signal during the import is held until the modules are loaded: raised inside the
            # initialization of onnx's C++ extension (nanobind), the KeyboardInterrupt aborts the
            # process (SIGABRT or SIGSEGV, no message) instead of ending the command.
            with critical():
                loaded = importlib.import_module(module)
            self.commands[cmd_name] = getattr(loaded, attr)
        return self.commands.get(cmd_name)

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


if __name__ == "__main__":  # pragma: no cover
    from onnx_remat.cli.entry import main as entry

    entry()
