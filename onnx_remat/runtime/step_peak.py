"""The absolute peak of a training step: what decides whether a step fits in memory.

:func:`absolute_step_peak` runs an artifacts directory (``training_model.onnx``, ``checkpoint``,
``optimizer_model.onnx``, ``eval_model.onnx``) through ``onnxruntime.training.api``: ``Module``
and ``Optimizer`` (the artifacts' AdamW), one warm-up step and then ``steps`` steps, each a
training step (forward, loss, backward into the gradient buffers), ``Optimizer.step()`` and
``lazy_reset_grad()``. It runs in a fresh process (started with
:data:`~onnx_remat.runtime.memory.LIVE_MALLOC_ENV`, so that freed buffers go back to the kernel),
and reports the process's peak RSS over its RSS before the checkpoint was loaded: parameters,
gradients, the optimizer's two moments, onnxruntime's arena and the step's activations, together.

The live and planned peaks (:func:`onnx_remat.measure`) count a step's activations only; this is
the figure a user compares with the machine's memory.

    python -m onnx_remat.runtime.step_peak ARTIFACTS_DIR FEEDS.npz [--steps 1] [--threads 2]

prints one JSON line: ``{"absolute_peak_bytes": N, "baseline_bytes": N, "losses": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from onnx_remat.errors import RematError
from onnx_remat.runtime.memory import LIVE_MALLOC_ENV, proc_status, reset_peak_rss


def training_api(artifacts: str | os.PathLike, threads: int = 1):
    """``(module, optimizer)``: ``onnxruntime.training.api`` ``Module`` (in training mode, seed 0,
    ``threads`` intra-op threads) and ``Optimizer`` of an artifacts directory."""
    import onnxruntime as ort
    from onnxruntime.training.api import CheckpointState, Module, Optimizer

    artifacts = Path(artifacts)
    ort.set_seed(0)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    state = CheckpointState.load_checkpoint(str(artifacts / "checkpoint"))
    module = Module(
        str(artifacts / "training_model.onnx"), state, str(artifacts / "eval_model.onnx"), session_options=so
    )
    optimizer = Optimizer(str(artifacts / "optimizer_model.onnx"), module)
    module.train()
    return module, optimizer


def _run_here(artifacts: Path, feeds: list[np.ndarray], steps: int, threads: int) -> dict:
    reset_peak_rss()
    baseline = proc_status("VmRSS")
    module, optimizer = training_api(artifacts, threads)
    losses = []
    for _ in range(1 + steps):
        losses.append(float(np.asarray(module(*feeds))))
        optimizer.step()
        module.lazy_reset_grad()
    peak = proc_status("VmHWM")
    return {
        "absolute_peak_bytes": None if peak is None or baseline is None else peak - baseline,
        "baseline_bytes": baseline,
        "losses": losses,
    }


def absolute_step_peak(
    artifacts: str | os.PathLike,
    feeds: Mapping[str, np.ndarray] | list[np.ndarray],
    *,
    steps: int = 1,
    threads: int = 2,
    timeout: float | None = None,
) -> dict:
    """Peak RSS of training steps of ``artifacts`` with ``Module`` + ``Optimizer``, in a fresh process.

    ``feeds``: the training graph's user inputs and labels, in the graph's input order (a list, or
    a mapping whose values are in that order). Returns ``{"absolute_peak_bytes", "baseline_bytes",
    "losses"}`` (``absolute_peak_bytes`` is None where ``/proc`` has no ``VmHWM``). Raises a
    one-line :class:`RematError` when the step fails.
    """
    arrays = list(feeds.values()) if isinstance(feeds, Mapping) else list(feeds)
    with tempfile.TemporaryDirectory(prefix="onnx-remat-step-peak-") as tmp:
        path = Path(tmp) / "feeds.npz"
        np.savez(path, *arrays)
        argv = [
            sys.executable,
            "-m",
            "onnx_remat.runtime.step_peak",
            str(artifacts),
            str(path),
            "--steps",
            str(steps),
            "--threads",
            str(threads),
        ]
        env = {**os.environ, **LIVE_MALLOC_ENV}
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RematError(f"{artifacts}: the training step took more than {timeout:.0f} s") from None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = " ".join(proc.stderr.strip()[-500:].split()) or "no output"
        raise RematError(f"{artifacts}: training step failed: {tail}")
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m onnx_remat.runtime.step_peak", description=__doc__.split("\n")[0])
    parser.add_argument("artifacts", type=Path)
    parser.add_argument("feeds", type=Path)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    with np.load(args.feeds) as data:
        feeds = [data[f"arr_{i}"] for i in range(len(data.files))]
    print(json.dumps(_run_here(args.artifacts, feeds, args.steps, args.threads)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
