"""Memory figures of one onnxruntime step: arena log capture and parsing, peak RSS.

onnxruntime-training 1.19.2 has no allocator-statistics API in Python, so the figures come from
two places (measured facts in ``shared/notes/ort-1.19.md``):

* the BFC arena's INFO log, written by C++ to file descriptor 2. :class:`Fd2Capture` redirects
  the descriptor itself (``sys.stderr`` is not enough) and :func:`parse_arena_log` reads the lines
  ``Extending BFCArena for <Name>. ... (requested) num_bytes: N``, ``Extended allocation by N
  bytes.`` and ``Total allocated bytes: N``. With the memory pattern on, a step allocates one block
  of the planner's activation peak: the largest requested extension during the step. With a shared
  arena that grows by exactly what is asked (``arena_extend_strategy=1``), the last total is the
  arena's peak footprint;
* the kernel's per-process counters in ``/proc/self/status``: writing ``5`` to
  ``/proc/self/clear_refs`` resets ``VmHWM`` to the current RSS, so ``VmHWM`` after a step minus
  ``VmRSS`` before it is the memory the step touched at its peak (:class:`RssPeak`).

Everything here is plain Python: no onnxruntime import.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

_EXTENDING = re.compile(r"Extending BFCArena for (?P<arena>[^.\s]+)\..*?\(requested\) num_bytes: (?P<n>\d+)")
_TOTAL = re.compile(r"Total allocated bytes: (?P<n>\d+)")

# glibc: a fixed mmap threshold (which also turns off its dynamic growth) and no trim threshold,
# so every large buffer onnxruntime frees without an arena goes back to the kernel at once and
# each step's peak RSS starts from the same level. Set for live-peak workers only.
LIVE_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


@dataclass
class ArenaLog:
    """What the arena lines of one log window say, for one arena name (``Cpu``, ``Cuda``)."""

    arena: str
    requested: list[int] = field(default_factory=list)
    totals: list[int] = field(default_factory=list)

    @property
    def largest_request(self) -> int | None:
        """The largest single allocation that made the arena grow, or None if it never grew."""
        return max(self.requested) if self.requested else None

    @property
    def total(self) -> int | None:
        """The arena's size after its last growth in the window, or None if it never grew."""
        return self.totals[-1] if self.totals else None


def parse_arena_log(text: str, arena: str = "Cpu") -> ArenaLog:
    """Read the BFC arena lines of ``text`` that belong to arena ``arena``.

    ``Total allocated bytes`` lines do not name their arena: each is attributed to the arena of
    the ``Extending BFCArena for <name>`` line before it (onnxruntime writes the two together).
    """
    out = ArenaLog(arena)
    current: str | None = None
    for line in text.splitlines():
        m = _EXTENDING.search(line)
        if m:
            current = m.group("arena")
            if current == arena:
                out.requested.append(int(m.group("n")))
            continue
        m = _TOTAL.search(line)
        if m and current == arena:
            out.totals.append(int(m.group("n")))
    return out


class Fd2Capture:
    """Redirect file descriptor 2 of this process to a file, to capture onnxruntime's C++ log.

    ``mark()`` returns the current end of the captured text, ``text(start, end)`` a window of it,
    so a caller can cut the log into session creation and each step. ``close()`` restores fd 2.
    Use as a context manager.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._file = open(self.path, "w+b")  # noqa: SIM115 - closed in close()
        self._saved: int | None = os.dup(2)
        os.dup2(self._file.fileno(), 2)

    def mark(self) -> int:
        """Byte offset of the end of what has been captured so far."""
        return os.fstat(self._file.fileno()).st_size

    def text(self, start: int = 0, end: int | None = None) -> str:
        """The captured text between two marks (to the end when ``end`` is None)."""
        data = self.path.read_bytes()
        return data[start:end].decode("utf-8", errors="replace")

    def close(self) -> None:
        """Put fd 2 back as it was. Safe to call twice."""
        if self._saved is not None:
            os.dup2(self._saved, 2)
            os.close(self._saved)
            self._saved = None
            self._file.close()

    def __enter__(self) -> Fd2Capture:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def proc_status(key: str) -> int | None:
    """A ``kB`` line of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in bytes; None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def reset_peak_rss() -> bool:
    """Reset this process's ``VmHWM`` to its current RSS. False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class RssPeak:
    """Peak RSS growth over a block of code: ``with RssPeak() as p: ...; p.bytes``.

    ``bytes`` is ``VmHWM`` after the block minus ``VmRSS`` at its start (after the high-water mark
    was reset), or None where ``/proc/self/clear_refs`` is not available.
    """

    def __init__(self) -> None:
        self.baseline: int | None = None
        self.peak: int | None = None
        self._ok = False

    def __enter__(self) -> RssPeak:
        self._ok = reset_peak_rss()
        self.baseline = proc_status("VmRSS")
        return self

    def __exit__(self, *exc) -> None:
        self.peak = proc_status("VmHWM")

    @property
    def bytes(self) -> int | None:
        """Peak growth in bytes, or None when it could not be measured."""
        if not self._ok or self.baseline is None or self.peak is None:
            return None
        return max(0, self.peak - self.baseline)
