"""A check run in a forked child process, beside the work that does not need its answer yet.

The load check's static part (:func:`onnx_remat.model_io.check_loadable`: ONNX's checker and strict
shape inference on the model's skeleton, the names, the initializers' data) takes 2.4 s of a
10^5-node command, and what follows it (graphsurgeon's import of the graph, the training regions,
the scopes: 2.9 s) reads nothing it finds until the tensor sizes are made from its typed
skeleton. Above :data:`~onnx_remat.model_io.RUNTIME_LOAD_CHECK_MAX_NODES` no onnxruntime session
runs beside the command, so the machine's second core sits idle: :class:`ForkedCheck` runs the
check there. ``fork`` gives the child the parsed model as it is (no second read or parse); the
child sends back the check's typed skeleton as wire bytes, or its refusal, and exits without
running the parent's exit handlers.

The verdict is settled before anything is returned or written (:meth:`ForkedCheck.result`), and a
refusal is what the command reports, whatever it met meanwhile on the unchecked graph
(:func:`onnx_remat.analysis.model.runtime_judged`), exactly as the sequential check would have
had it. A child that dies without an answer (a crash in ONNX's C++ checker on a hostile file) is a
refusal too, with the signal named. Where ``fork`` is missing (not POSIX), the check runs in the
command as before. The child is made as :mod:`onnx_remat.forked` makes its children; a check's
crash, unlike a computation's, is an answer (a refusal), so its answer has a form of its own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import onnx

from onnx_remat import errors
from onnx_remat.forked import fork_child, stop_child

# What the child sends: a tag byte, then the payload.
_MODEL, _NONE, _REFUSED, _FAILED = b"M", b"N", b"R", b"X"


class ForkedCheck:
    """A check started in a forked child (:meth:`start`); :meth:`result` waits for it."""

    def __init__(self, pid: int, fd: int, where: str) -> None:
        self._pid = pid
        self._fd = fd
        self._where = where
        self._done = False

    @classmethod
    def start(cls, check: Callable[[], onnx.ModelProto | None], where: str) -> ForkedCheck | None:
        """Run ``check`` (returns a model or None; raises a :class:`~onnx_remat.errors.RematError`
        to refuse) in a forked child; None where this platform has no ``fork``. ``where`` names the
        model in the message of a child that dies without an answer."""
        started = fork_child(lambda fd: _answer(fd, check))
        if started is None:
            return None
        pid, read_end = started
        return cls(pid, read_end, where)

    def result(self) -> onnx.ModelProto | None:
        """Wait for the check's answer: its model (or None), or raise its refusal as the error it
        raised (a :class:`~onnx_remat.errors.RematError`, one line). Once only."""
        if self._done:
            raise RuntimeError("ForkedCheck.result: the answer was taken already")
        self._done = True
        try:
            with os.fdopen(self._fd, "rb") as pipe:
                data = pipe.read()
        finally:
            _, status = os.waitpid(self._pid, 0)
        tag, payload = data[:1], data[1:]
        if tag == _MODEL:
            model = onnx.ModelProto()
            model.ParseFromString(payload)
            return model
        if tag == _NONE:
            return None
        if tag == _REFUSED:
            raised = json.loads(payload)
            kind = getattr(errors, raised["type"], None)
            if not (isinstance(kind, type) and issubclass(kind, errors.RematError)):
                kind = errors.RematError
            raise kind(raised["message"])
        if tag == _FAILED:
            raise RuntimeError(payload.decode("utf-8", "replace"))
        how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
        raise errors.RematError(f"{self._where}: ONNX's checks of it crashed ({how}); onnxruntime would not load it")

    def cancel(self) -> None:
        """Stop the child and reap it (its answer is no longer needed)."""
        if self._done:
            return
        self._done = True
        stop_child(self._pid, self._fd)


def _answer(fd: int, check: Callable[[], onnx.ModelProto | None]) -> None:
    """In the child: run ``check`` and write its answer to ``fd``."""
    try:
        model = check()
        data = _NONE if model is None else _MODEL + model.SerializeToString()
    except errors.RematError as exc:
        data = _REFUSED + json.dumps({"type": type(exc).__name__, "message": str(exc)}).encode()
    except Exception as exc:  # an internal error: the parent raises it as one
        data = _FAILED + f"{type(exc).__name__}: {exc}".encode()
    with os.fdopen(fd, "wb") as pipe:
        pipe.write(data)
