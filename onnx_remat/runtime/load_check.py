"""onnxruntime's own verdict on loading a graph: what a static check cannot settle.

:func:`onnx_remat.ortsim.validity.check_types_and_shapes` flags a shape that strict ONNX inference
rejects (:class:`~onnx_remat.ortsim.validity.ShapeSuspicion`); onnxruntime refuses some such
graphs at load and runs others; and onnxruntime's own ops (``com.microsoft`` gradients,
``InPlaceAccumulatorV2``, ...) are typed and attribute-checked by nothing but its load.
:func:`onnxruntime_load_error` asks onnxruntime, with graph optimizations off, as the model's
reader would meet it: once per command, when a model is read
(:func:`onnx_remat.model_io.check_loadable`).

:func:`start_load_check` asks it in a child process instead (:class:`PendingLoadCheck`), so the
command analyses the graph while onnxruntime loads it; the command settles the verdict before it
returns anything, and an error it met meanwhile gives way to onnxruntime's refusal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx

from onnx_remat.interrupts import critical


def onnxruntime_load_error(model: str | os.PathLike | onnx.ModelProto) -> str | None:
    """The first line of onnxruntime's error when it refuses to load ``model`` (a file, or a model
    in memory), else None."""
    # Imported here, not at the top (commands that never read a model skip it), and with signals
    # held: a Ctrl-C or SIGTERM inside the extension's initialisation would surface as an
    # ImportError ("initialization failed") instead of the command's clean interrupted exit.
    with critical():
        import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(Path(model))
    try:
        ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types (Fail, InvalidGraph, ...)
        text = " ".join(str(exc).split())
        return text[:400] or type(exc).__name__
    return None


# The load check of a model file runs beside the command, in a child process, where that saves
# time: when this process has not imported onnxruntime (here the import takes ~2.5 s: it imports
# torch; the child's takes 0.2 s), or the graph is large enough for the session to take seconds.
# A small graph in a process that has onnxruntime already (tests, notebooks) is checked here.
CHILD_MIN_NODES = 2_000


class PendingLoadCheck:
    """onnxruntime's load of a model file, judged in a child process while the command goes on.

    Started by :func:`start_load_check`; :meth:`refusal` waits for the verdict (the first line of
    onnxruntime's error, or None), :meth:`cancel` stops the child. A child that dies without a
    verdict (onnxruntime crashed on the file, or ran out of memory) is a refusal too: the same
    model would crash the training run.
    """

    def __init__(self, path: str | os.PathLike):
        # The child writes its verdict as JSON on stdout; stderr is dropped (onnxruntime's own
        # logging is silenced in the child, and a crash report says nothing a user can act on).
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "onnx_remat.runtime.load_check", str(path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self._verdict: tuple[str | None] | None = None

    def refusal(self) -> str | None:
        """The first line of onnxruntime's error if it refuses the model, else None (waits)."""
        if self._verdict is None:
            out, _ = self._proc.communicate()
            code = self._proc.returncode
            if code == 0:
                self._verdict = (json.loads(out.decode() or "null"),)
            elif code < 0:
                self._verdict = (f"onnxruntime crashed loading it (signal {-code})",)
            else:
                self._verdict = (f"onnxruntime's load check failed (exit status {code})",)
        return self._verdict[0]

    def cancel(self) -> None:
        """Stop the child if it still runs (the command ends without needing the verdict)."""
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


def start_load_check(path: str | os.PathLike, nodes: int) -> PendingLoadCheck | None:
    """A :class:`PendingLoadCheck` of the model file ``path`` (``nodes`` in its graph), or None where
    the check is cheaper in this process (:data:`CHILD_MIN_NODES`)."""
    if nodes < CHILD_MIN_NODES and "onnxruntime" in sys.modules:
        return None
    return PendingLoadCheck(path)


if __name__ == "__main__":  # the child of PendingLoadCheck: one model file, its verdict on stdout
    # onnxruntime's __init__ probes for its training package, which imports torch: 2.5 s of the
    # child's 2.7 s on a small graph. Loading a graph needs none of it (the kernels of onnxruntime's
    # training ops are in the native library), and a missing module is what the probe expects of
    # an inference-only install. Only this child, which ends after one load, does without it.
    sys.modules["onnxruntime.training"] = None  # type: ignore[assignment]
    print(json.dumps(onnxruntime_load_error(sys.argv[1])))
