"""Signals as exceptions, so that every exit runs the ``finally`` blocks that remove temporaries.

Python turns SIGINT (Ctrl-C) into :class:`KeyboardInterrupt`, but SIGTERM and SIGHUP kill the
process on the spot: a half-written temporary file or folder stays behind. :func:`install` (the
command line calls it before anything else) makes all three raise :class:`Interrupted`, a
``KeyboardInterrupt``, in the main thread; the writers of :mod:`onnx_remat.model_io` clean up in
``finally`` blocks, and the command line prints one word (``interrupted``, ``terminated``) and
exits with 128 + the signal number.

A signal must not cut a rename, or the removal of a temporary, in half: :func:`critical` holds a
signal that arrives during such a block back until the block ends, then raises it. This is done
in the Python-level handler, not with ``pthread_sigmask``: a blocked signal is still delivered
to another thread (numpy's BLAS threads, rich's refresh thread), and CPython then runs the
handler in the main thread anyway.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# SIGHUP: the terminal went away; same clean exit as SIGTERM.
SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)
_WORDS: dict[int, str] = {int(signal.SIGINT): "interrupted", int(signal.SIGTERM): "terminated"}


class Interrupted(KeyboardInterrupt):
    """A signal (SIGINT, SIGTERM, SIGHUP) arrived; ``exit_code`` is 128 + its number."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signum)
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def word(self) -> str:
        """``interrupted`` (SIGINT), ``terminated`` (SIGTERM), ``hung up`` (SIGHUP)."""
        return _WORDS.get(self.signum, "hung up")


_depth = 0  # nesting of critical() blocks in the main thread
_pending: int | None = None  # a signal held back by critical()


def _handler(signum: int, frame) -> None:
    global _pending
    if _depth:
        _pending = signum  # raised when the critical block ends
        return
    raise Interrupted(signum)


def install() -> None:
    """Make SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` (main thread only; else a no-op).

    A signal the process was started ignoring stays ignored (``nohup`` ignores SIGHUP, a shell
    ignores SIGINT for background jobs): only the default dispositions are replaced."""
    if threading.current_thread() is not threading.main_thread():
        return
    for s in SIGNALS:
        if signal.getsignal(s) in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(s, _handler)


def installed() -> bool:
    """Whether :func:`install` is in effect for SIGINT."""
    return signal.getsignal(signal.SIGINT) is _handler


@contextmanager
def critical() -> Iterator[None]:
    """Hold signals back while the block runs; one that arrived is raised when it ends.

    Used around renames and the removal of temporaries, and around the import of a command's
    modules (a KeyboardInterrupt raised inside a C++ extension's initialization aborts the process).
    Where :func:`install` was not called (the library used from Python), Python's own Ctrl-C
    handler is swapped for the holding one for the duration of the block. Outside the main thread
    signals never arrive: a no-op.
    """
    global _depth, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    swapped = None
    if _depth == 0 and not installed() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        swapped = signal.signal(signal.SIGINT, _handler)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            if swapped is not None:
                signal.signal(signal.SIGINT, swapped)
            if _pending is not None:
                signum, _pending = _pending, None
                raise Interrupted(signum)
