"""The output's validity check in a fresh process, beside the command.

:func:`~onnx_remat.ortsim.registry.check_runtime_support` of a 10^5-node rewrite takes 2.2 s, and
the memory schedule has the graph it writes seconds before that graph's emulation and estimate
are done: :class:`CheckProcess` checks it meanwhile, on the second core. Not in a forked child: a
fork's resident set starts with every page of the command's (1.8 GiB there), so its peak would
read as the command's plus the check's. A fresh interpreter reads the model from a temporary file
instead (written in 0.2 s at 10^5 nodes; the child removes it once read) and holds only what the
check needs.

The verdict is what :func:`check_runtime_support` says of the same bytes: ``True`` when the
model passes. ``False`` (a refusal, or a child that failed) leaves the caller to check in its own
process, so that a refusal reads exactly as it would have
(:func:`onnx_remat.scheduling.schedule.check_scheduled`). A verdict reached in another process (a
forked child that checked the graph it made) is handed over as a :class:`CheckVerdict`.

The check process dies with the process that started it (Linux's parent-death signal): a child
of the command stopped while its check runs leaves no check behind it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import onnx

from onnx_remat import collector

# Above this size the model is checked in the command as before: writing its bytes out (weights
# included, for a model that holds them) would cost more than the check.
MAX_MODEL_BYTES = 512 * 2**20

_PASSED = b"passed"
CHECK_FILE_PREFIX = "onnx-remat-check-"  # of the files models are handed over in


class CheckProcess:
    """``check_runtime_support`` of one model in a child process (:meth:`start`); :meth:`result`
    waits for the verdict, :meth:`cancel` stops it."""

    def __init__(self, proc: subprocess.Popen, path: str) -> None:
        self._proc = proc
        self._path = path
        self._owner = os.getpid()  # only the process that started it stops it (see onnx_remat.forked)
        self._done = False

    @classmethod
    def start(cls, model: onnx.ModelProto, path: str | None = None) -> CheckProcess | None:
        """Start the check of ``model`` (None where it is too large to hand over:
        :data:`MAX_MODEL_BYTES`). ``path``: the file to hand it over in, made (and removed, should
        this process be stopped first) by the caller; by default a new temporary file."""
        if model.ByteSize() > MAX_MODEL_BYTES:
            return None
        if path is None:
            fd, path = tempfile.mkstemp(prefix=CHECK_FILE_PREFIX, suffix=".onnx")
            os.close(fd)
        with open(path, "wb") as file:
            file.write(model.SerializeToString())
        proc = subprocess.Popen(
            [sys.executable, "-m", "onnx_remat.ortsim.check_process", path, str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        return cls(proc, path)

    def result(self) -> bool:
        """True when the model passes; False when it was refused or the child failed (waits)."""
        if self._done:
            raise RuntimeError("CheckProcess.result: the verdict was taken already")
        self._done = True
        out, _ = self._proc.communicate()
        self._remove()
        return self._proc.returncode == 0 and out.strip() == _PASSED

    def cancel(self) -> None:
        """Stop the child (its verdict is no longer needed)."""
        if self._done or os.getpid() != self._owner:
            return
        self._done = True
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._remove()

    def _remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)

    def __del__(self) -> None:
        # A check started and then not wanted (a schedule candidate dropped) stops with it.
        with contextlib.suppress(Exception):
            self.cancel()


@dataclass(frozen=True)
class CheckVerdict:
    """The verdict of a check already made, in another process: what :meth:`CheckProcess.result`
    said there (picklable, unlike the process)."""

    passed: bool

    def result(self) -> bool:
        return self.passed

    def cancel(self) -> None:
        """Nothing runs: nothing to stop."""


_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    """In the check process: be killed when ``parent`` (the process that started it) dies, and exit
    now if it has died already (before this ran). On Linux; elsewhere, nothing. Armed here rather
    than in ``Popen``'s ``preexec_fn``, which is unsafe where the starting process has threads."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # no C library to ask: the check runs unarmed, as before
        return
    if os.getppid() != parent:
        sys.exit(1)


@collector.pauses
def _check_file(path: str) -> bytes:
    """In the child: the verdict on the model in ``path``, which is removed once read."""
    from onnx_remat.errors import RematError
    from onnx_remat.ortsim.registry import check_runtime_support

    model = onnx.ModelProto()
    with open(path, "rb") as file:
        model.ParseFromString(file.read())
    os.unlink(path)
    try:
        check_runtime_support(model, "model")
    except RematError:
        return b"refused"
    return _PASSED


if __name__ == "__main__":  # the child of CheckProcess: one model file, its verdict on stdout
    _die_with(int(sys.argv[2]))
    sys.stdout.buffer.write(_check_file(sys.argv[1]))
