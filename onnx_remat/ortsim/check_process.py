"""The output's validity check in a fresh process, beside the command.

:func:`~onnx_remat.ortsim.registry.check_runtime_support` of a 10^5-node rewrite takes 2.2 s, and
the memory schedule has the graph it writes seconds before that graph's emulation and estimate
are done: :class:`CheckProcess` checks it meanwhile, on the second core. Not in a forked child: a
fork's resident set starts with every page of the command's (1.8 GiB there), so its peak would
read as the command's plus the check's. A fresh interpreter reads the model from a temporary file
instead and holds only what the check needs: the file is written by the child itself between its
fork and its exec (0.45 s at 10^5 nodes that the command does not wait for), and removed by the
check once read.

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
_MAX_FD = os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 256
CHECK_FILE_PREFIX = "onnx-remat-check-"  # of the files models are handed over in


class CheckProcess:
    """``check_runtime_support`` of one model in a child process (:meth:`start`); :meth:`result`
    waits for the verdict, :meth:`cancel` stops it. ``pid`` is the check process's; ``returncode``
    its exit status once it is reaped (None before)."""

    def __init__(self, pid: int, fd: int, path: str, popen: subprocess.Popen | None = None) -> None:
        self.pid = pid
        self._fd = fd  # the read end of its standard output
        self._path = path
        self._popen = popen  # where it was started without fork: the Popen that reaps it
        self._owner = os.getpid()  # only the process that started it stops it (see onnx_remat.forked)
        self._done = False
        self.returncode: int | None = None

    @classmethod
    def start(cls, model: onnx.ModelProto, path: str | None = None) -> CheckProcess | None:
        """Start the check of ``model`` (None where it is too large to hand over:
        :data:`MAX_MODEL_BYTES`). ``path``: the file to hand it over in, made (and removed, should
        this process be stopped first) by the caller; by default a new temporary file.

        The model is written out by the child itself, between its fork and its exec of the check:
        serializing a 10^5-node rewrite takes this process 0.45 s, the fork a few milliseconds (the
        exec then drops the fork's copy of this process). Where there is no ``fork``, it is written
        here and the check started as a plain subprocess."""
        if model.ByteSize() > MAX_MODEL_BYTES:
            return None
        if path is None:
            fd, path = tempfile.mkstemp(prefix=CHECK_FILE_PREFIX, suffix=".onnx")
            os.close(fd)
        argv = [sys.executable, "-m", "onnx_remat.ortsim.check_process", path, str(os.getpid())]
        if not hasattr(os, "fork"):
            with open(path, "wb") as file:
                file.write(model.SerializeToString())
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            assert proc.stdout is not None
            return cls(proc.pid, os.dup(proc.stdout.fileno()), path, proc)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: write the model, become the check (nothing of this process runs on)
            try:
                os.close(read_end)
                with open(path, "wb") as file:
                    file.write(model.SerializeToString())
                devnull = os.open(os.devnull, os.O_RDWR)
                os.dup2(devnull, 0)
                os.dup2(write_end, 1)
                os.dup2(devnull, 2)
                os.closerange(3, _MAX_FD)  # as Popen's close_fds: no other pipe's end stays open in it
                os.execv(sys.executable, argv)
            finally:
                os._exit(1)  # (only where the exec failed: the verdict is then a failure)
        os.close(write_end)
        return cls(pid, read_end, path)

    def result(self) -> bool:
        """True when the model passes; False when it was refused or the child failed (waits)."""
        if self._done:
            raise RuntimeError("CheckProcess.result: the verdict was taken already")
        self._done = True
        chunks = []
        with os.fdopen(self._fd, "rb") as pipe:
            while chunk := pipe.read():
                chunks.append(chunk)
        self._reap()
        self._remove()
        return self.returncode == 0 and b"".join(chunks).strip() == _PASSED

    def cancel(self) -> None:
        """Stop the child (its verdict is no longer needed)."""
        if self._done or os.getpid() != self._owner:
            return
        self._done = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self._reap()
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._remove()

    def _reap(self) -> None:
        if self._popen is not None:
            self.returncode = self._popen.wait()
            if self._popen.stdout is not None:
                self._popen.stdout.close()
            return
        _, status = os.waitpid(self.pid, 0)
        self.returncode = os.waitstatus_to_exitcode(status)

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
