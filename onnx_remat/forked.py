"""Work run in a forked child process, beside work in this one that does not need its answer yet.

The machines onnx-remat targets have a few cores, and a command is one Python thread: at 10^5
nodes it spends half a minute on one core. Where two steps of a command read the same state and
neither needs the other's answer until later (the original graph's estimate and the rewrite; two
orders' memory plans; two reference plans of the budget planner), :class:`Forked` runs one of them
in a child made by ``fork``: the child gets the parent's state as it is (no copy, no pickling of
the inputs), computes, and sends back its value pickled.

The answer is the sequential one by construction. ``compute`` must be a deterministic function of
state the parent does not change before :meth:`Forked.result`; where the child fails in any way
(an exception, a signal, a truncated answer) the parent computes the value itself, so an error is
raised where and as it would have been without the fork, with its own traceback. A child may check
its own state after it has sent its value (``Forked.start(then=...)``: the recompute rewrite's
postconditions): the parent works on the value meanwhile and reads the check's verdict later
(:meth:`Forked.confirmed`), computing the value itself where the check failed.

Only graphs above :data:`FORK_MIN_NODES` nodes use a child (:func:`worth_running_beside`): below it, onnxruntime's
load check runs in a child process on the second core already (:mod:`onnx_remat.model_io`), the
work is short, and the command stays as it was. A child forks no child of its own: it runs beside
the command already, and a third process would only take turns with the two on the cores (seen:
the budget planner's solve took 7.5 s instead of 3 beside a schedule made ahead that forked its
policies' predictions). Where ``fork`` is missing (not POSIX), the work runs in the command.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    import onnx

T = TypeVar("T")

# Above this many nodes, work that can run beside the command's own does (beside()). The same size
# above which no onnxruntime session is started for the load check (model_io), so the second core
# is free.
FORK_MIN_NODES = 30_000

# The largest model a forked child sends back whole (a rewrite, pickled: the budget planner's
# reference plans, RecomputeRewrite on a large graph). Above it the work stays in the command.
PORTABLE_MODEL_MAX_BYTES = 256 * 2**20

_VALUE, _FAILED, _CONFIRMED = b"V", b"X", b"C"

_in_child = False  # set in a child of fork_child: it forks no child of its own


def fork_child(write: Callable[[int], None]) -> tuple[int, int] | None:
    """Fork; in the child call ``write(fd)`` (``fd``: the write end of a pipe, which ``write``
    closes) and leave without running the parent's exit handlers. Returns ``(pid, read end)`` in
    the parent, or None where this platform has no ``fork``."""
    if not hasattr(os, "fork"):
        return None
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: work, answer, leave (no exit handlers, no buffered output)
        global _in_child
        _in_child = True
        os.close(read_end)
        code = 0
        try:
            # A Ctrl-C reaches the terminal's whole process group: the parent handles it and stops
            # the child (cancel); the parent's handlers must not run here.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            write(write_end)
        except BaseException:  # nothing may escape a forked child
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    return pid, read_end


def stop_child(pid: int, fd: int) -> None:
    """Kill a child of :func:`fork_child` whose answer is no longer wanted, and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.close(fd)
    os.waitpid(pid, 0)


class Forked(Generic[T]):
    """A value being computed in a forked child (:meth:`start`), or already computed here.

    ``result()`` waits for it (once); ``cancel()`` stops the child. Usable as a context manager
    that cancels on the way out whatever was not taken, so no child outlives an error."""

    def __init__(
        self,
        compute: Callable[[], T],
        pid: int | None = None,
        fd: int | None = None,
        cleanup: Callable[[], None] | None = None,
    ) -> None:
        self._compute = compute
        self._pid = pid
        self._fd = fd
        self._cleanup = cleanup
        # The process that started the child: only it stops or reaps it (a later fork of this
        # process holds a copy of this object, and must not kill its sibling).
        self._owner = os.getpid()
        self._value: T | None = None
        self._has_value = False
        self._done = False
        # With a check the child runs after its answer (start's ``then``): the pipe, read on for its
        # verdict once the value is taken (confirmed()); None once read or where there is none.
        self._then = False
        self._pipe: IO[bytes] | None = None
        self._verdict: bool | None = None

    @classmethod
    def start(
        cls,
        compute: Callable[[], T],
        *,
        cleanup: Callable[[], None] | None = None,
        child: Callable[[], T] | None = None,
        then: Callable[[], object] | None = None,
    ) -> Forked[T]:
        """Start ``compute`` in a forked child (computed here and now where there is no ``fork``).
        ``cleanup`` runs here once the child is gone, whether its value was taken or it was
        stopped: it removes what the child may have left (a file a stopped child was writing).
        ``child``: what the child computes instead, the same value by a way only a child may take
        (it edits state the parent keeps, in the child's own copy of it); ``compute`` is then what
        this process computes where there is no child, or where the child failed.
        ``then``: a check of the child's own state that the child runs after it has sent its value
        (it raises on failure), so this process takes the value (:meth:`result`) while the check
        still runs, and its outcome later (:meth:`confirmed`); ``compute`` must include that check."""
        in_child = child if child is not None else compute
        started = fork_child(lambda fd: _answer(fd, in_child, then))
        if started is None:
            value = compute()
            if cleanup is not None:
                cleanup()
            return cls.done(value)
        forked = cls(compute, *started, cleanup=cleanup)
        forked._then = then is not None
        return forked

    @classmethod
    def done(cls, value: T) -> Forked[T]:
        """A value computed already (what :func:`beside` gives for a small graph)."""
        made: Forked[T] = cls(lambda: value)
        made._value, made._has_value = value, True
        return made

    @property
    def in_child(self) -> bool:
        """Whether the value is (being) computed in a child."""
        return self._pid is not None

    def result(self) -> T:
        """The value: the child's, or (where the child failed) computed here."""
        if self._done:
            raise RuntimeError("Forked.result: the value was taken already")
        self._done = True
        if self._has_value:
            value, self._value = self._value, None
            return value  # type: ignore[return-value]
        assert self._pid is not None and self._fd is not None
        answered, value = False, None
        pipe = os.fdopen(self._fd, "rb")
        try:
            if pipe.read(1) == _VALUE:
                with contextlib.suppress(Exception):  # a truncated answer: computed here
                    value, answered = pickle.load(pipe), True
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
            self._reap(pipe)
            raise
        if answered and self._then:
            self._pipe = pipe  # the child's check goes on: its verdict is read by confirmed()
            return value  # type: ignore[return-value]
        self._reap(pipe)
        if answered:
            return value  # type: ignore[return-value]
        self._then = False  # computed here, check included
        return self._compute()  # the child failed: the error (or the value) as it comes here

    def confirmed(self) -> bool:
        """Whether the check the child ran after sending its value (start's ``then``) passed: waits
        for its verdict. True where there is no such check, or where the value was computed here
        (with the check). False where the check failed, the child died before its verdict, or the
        child was stopped (:meth:`cancel`) before it."""
        if not self._done:
            raise RuntimeError("Forked.confirmed: the value is taken first (result)")
        if self._verdict is None:
            pipe, self._pipe = self._pipe, None
            if pipe is None:  # no check, or computed here (with it); or stopped before its verdict
                self._verdict = not self._then
            else:
                try:
                    self._verdict = pipe.read(1) == _CONFIRMED
                finally:
                    self._reap(pipe)
        return self._verdict

    def recompute(self) -> T:
        """The value computed here, as where the child fails: after a check the child ran on its own
        value failed (:meth:`confirmed`), this raises that check's error, or returns the value."""
        return self._compute()

    def _reap(self, pipe: IO[bytes]) -> None:
        """Close the pipe, wait for the child and clean up after it."""
        with contextlib.suppress(OSError):
            pipe.close()
        assert self._pid is not None
        os.waitpid(self._pid, 0)
        self._clean()

    def cancel(self) -> None:
        """Stop the child (its value, or the verdict of its check, is no longer needed)."""
        if os.getpid() != self._owner:
            return
        if self._pipe is not None:  # the value was taken, the child's check goes on
            pipe, self._pipe = self._pipe, None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)  # type: ignore[arg-type]
            self._reap(pipe)
            return
        if self._done:
            return
        self._done = True
        self._value = None
        if self._pid is not None and self._fd is not None:
            stop_child(self._pid, self._fd)
            self._clean()

    def _clean(self) -> None:
        cleanup, self._cleanup = self._cleanup, None
        if cleanup is not None:
            cleanup()

    def __getstate__(self) -> None:
        raise TypeError("a Forked value stays in the process that started it")

    def __del__(self) -> None:
        # A value started and then not wanted (a candidate dropped with what holds it) stops with it.
        with contextlib.suppress(Exception):
            self.cancel()

    def __enter__(self) -> Forked[T]:
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()


def large_graph(nodes: int) -> bool:
    """Whether a graph of ``nodes`` nodes is large enough for work beside the command's own: above
    :data:`FORK_MIN_NODES` (read when asked, so a test can lower it)."""
    return nodes > FORK_MIN_NODES


def in_forked_child() -> bool:
    """Whether this process is a child of :func:`fork_child` (its state is its own copy)."""
    return _in_child


def worth_running_beside(nodes: int) -> bool:
    """Whether work on a graph of ``nodes`` nodes runs beside the command's own, in a forked child:
    on a :func:`large_graph`, unless this process is such a child already."""
    return large_graph(nodes) and not _in_child


def worth_sending_back(model: onnx.ModelProto) -> bool:
    """Whether a rewrite of ``model`` is made in a forked child that sends the rewritten model back
    whole: a :func:`worth_running_beside` graph whose model is at most
    :data:`PORTABLE_MODEL_MAX_BYTES` (its weights are inside it)."""
    return worth_running_beside(len(model.graph.node)) and model.ByteSize() <= PORTABLE_MODEL_MAX_BYTES


def beside(compute: Callable[[], T], nodes: int) -> Forked[T]:
    """``compute`` in a forked child where the graph (of ``nodes`` nodes) is large enough
    (:func:`worth_running_beside`), else computed now: the caller goes on with its own work and takes the
    value with :meth:`Forked.result` when it needs it."""
    if worth_running_beside(nodes):
        return Forked.start(compute)
    return Forked.done(compute())


def _answer(fd: int, compute: Callable[[], object], then: Callable[[], object] | None = None) -> None:
    """In the child: compute and write the pickled value to ``fd`` (or the failure tag); then, with
    ``then``, run that check and write its verdict (the confirmed or the failure tag)."""
    with os.fdopen(fd, "wb") as pipe:
        try:
            value = compute()
        except BaseException:
            pipe.write(_FAILED)
            return
        pipe.write(_VALUE)
        pickle.dump(value, pipe, protocol=pickle.HIGHEST_PROTOCOL)
        if then is None:
            return
        pipe.flush()  # the parent goes on with the value while the check runs
        del value
        try:
            then()
        except BaseException:
            pipe.write(_FAILED)
            return
        pipe.write(_CONFIRMED)
