"""The ``onnx-remat`` console script: signal handlers first, then the (heavy) command line.

Importing the commands loads onnx, numpy, rich and graphsurgeon, which takes half a second; a
Ctrl-C in that time used to print a KeyboardInterrupt traceback. So this module imports nothing
heavy: :func:`main` installs the signal handlers (:func:`onnx_remat.interrupts.install`) and only
then imports the click group (:mod:`onnx_remat.cli.main`). Whenever a signal arrives after that,
the command stops through the normal exception path (so temporaries are removed), one word is
printed (``interrupted`` for Ctrl-C) and the exit status is 128 + the signal number (130).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys

from onnx_remat.interrupts import Interrupted, install


def _quiet_exit(code: int) -> None:
    """Exit at once: flushing a closed pipe, or a signal during interpreter shutdown, must not
    print a traceback. Every temporary was removed by then (``finally`` blocks ran)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _ignore_signals() -> None:
    """Already on the way out: a second Ctrl-C must not interrupt the last message."""
    import signal

    from onnx_remat.interrupts import SIGNALS

    for s in SIGNALS:
        with contextlib.suppress(OSError, ValueError):
            signal.signal(s, signal.SIG_IGN)


def main(argv: list[str] | None = None) -> None:
    """Run the command line on ``argv`` (default: ``sys.argv[1:]``) and exit with its status."""
    install()
    # The commands build graphs of 10^5 nodes with millions of small objects (graphsurgeon nodes,
    # emulated tensors, plans), and leave almost no cyclic garbage: the rewrite breaks its working
    # copy's cycles itself (ModelGraph.release), everything else is freed by reference counting. The
    # cyclic collector's passes over that heap then cost time and find nothing: with CPython's
    # default threshold a quarter of `apply` on a 20k-node graph; with a first-generation threshold of
    # 50,000 still 8% of `apply` on 10^5 nodes (3.1 s of 40: 180 passes), which then left 402
    # unreachable objects for a final collection to find. So a command runs without it (measured on
    # 10^5 nodes: the same peak RSS; `--budget 50%` on 21k nodes: the same peak RSS). A command is
    # one short process. (The library's entry points pause it for their call only, and turn it on
    # again after: onnx_remat.collector.)
    gc.disable()
    code = 1
    try:
        import click

        from onnx_remat.cli.main import main as group

        args = sys.argv[1:] if argv is None else argv
        try:
            with group.make_context("onnx-remat", list(args)) as ctx:
                group.invoke(ctx)
            code = 0
        except click.exceptions.Exit as exc:
            code = exc.exit_code
        except click.UsageError as exc:  # one line, like every other error (click prints three)
            hint = f" (see '{exc.ctx.command_path} -h')" if exc.ctx is not None else ""
            message = " ".join(exc.format_message().split())
            print(f"error: {message}{hint}", file=sys.stderr)
            code = exc.exit_code
        except click.ClickException as exc:
            print(f"error: {' '.join(exc.format_message().split())}", file=sys.stderr)
            code = exc.exit_code
        except click.exceptions.Abort:
            print("aborted", file=sys.stderr)
            code = 1
        sys.stdout.flush()
    except KeyboardInterrupt as exc:
        _ignore_signals()
        word = exc.word if isinstance(exc, Interrupted) else "interrupted"
        code = exc.exit_code if isinstance(exc, Interrupted) else 130
        with contextlib.suppress(Exception):
            print(word, file=sys.stderr)
    except BrokenPipeError:  # `onnx-remat ... | head`: the reader left; nothing more to say
        _ignore_signals()
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except Exception:
            pass
        code = 141  # 128 + SIGPIPE, as a shell reports a writer killed by the closed pipe
    _ignore_signals()
    _quiet_exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
