"""Run ONE measured configuration of a training graph in this (fresh) process.

``python -m onnx_remat.runtime.worker SPEC.json``. An arena never gives memory back and glibc
keeps freed pages, so every configuration gets a process of its own; :mod:`.measure` starts them.

The spec (JSON object):

``kind``
    ``arena``: shared exact-growth arena, INFO log captured from fd 2, first step profiled, the
    optimized graph written; reports the planned activation peak, the arena's size, step times,
    the loss, the first step's outputs, and which outputs the second step computed differently
    (nondeterministic kernels). ``live`` (CPU): no arena; reports the peak RSS growth of each
    timed step after the warm-up. ``outputs``: one step with ``threads`` intra-op threads, its
    outputs saved (the deterministic reference for compare).
``model``, ``device`` (``cpu``/``cuda``), ``feeds`` (arrays file, :func:`~.inputs.save_arrays`),
``checkpoint`` (path or null), ``from_checkpoint`` (parameter names to read from it),
``buffers`` (``{gradient buffer: parameter}``), ``flags`` (names fed ``[True]``), ``warmup``,
``steps``, ``seed``, ``workdir`` (log, profile, optimized graph, ``outputs.npz`` go there),
``save_outputs`` (bool); for ``outputs`` also ``threads`` and ``steps``.

Output: JSON lines on stdout. ``{"progress": {"phase", "index", "total", "seconds"}}`` while
running, then one ``{"result": {...}}`` or ``{"error": {"exit_code", "message"}}``. Anything
else the process writes (onnxruntime's own output) goes to stderr.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from onnx_remat.errors import EnvironmentProblem, RematError, one_line
from onnx_remat.runtime.inputs import load_arrays, save_arrays
from onnx_remat.runtime.memory import Fd2Capture, RssPeak, parse_arena_log
from onnx_remat.runtime.session import (
    ARENA_NAMES,
    create_session,
    import_onnxruntime,
    register_env_arena,
    session_options,
)

_SOURCE_PREFIX = re.compile(r"^\S*onnxruntime_src/\S+:\d+\s.*?(?=\[ONNXRuntimeError\])")
_STATUS_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
_CODE_LOCATION = re.compile(r"^\w+\.(?:cc|cpp|h):\d+ \S+ ")


def runtime_message(exc: BaseException) -> str:
    """onnxruntime's message on one line, without the C++ source file, line and function it names
    (``/onnxruntime_src/...cc:945 ... [ONNXRuntimeError] : 1 : FAIL : checkpoint.cc:867 F ...``)."""
    text = one_line(exc)
    text = _SOURCE_PREFIX.sub("", text)
    text = _STATUS_PREFIX.sub("", text)
    text = _CODE_LOCATION.sub("", text)
    return text.strip() or type(exc).__name__


def load_checkpoint_parameters(ort, path: str, names: list[str]) -> dict[str, np.ndarray]:
    """Parameters ``names`` read from an onnxruntime-training checkpoint, as numpy copies.

    Raises RematError naming the parameters the checkpoint lacks.
    """
    from onnxruntime.capi import _pybind_state as C

    try:
        state = C.load_checkpoint(str(path))
    except Exception as exc:
        raise RematError(f"{path}: cannot read the checkpoint: {runtime_message(exc)}") from None
    missing = [n for n in names if not state.has_parameter(n)]
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise RematError(f"{path}: the checkpoint lacks {len(missing)} of the graph's {len(names)} parameters: {shown}")
    out = {n: np.array(state.get_parameter(n).data.numpy(), copy=True) for n in names}
    del state
    return out


def build_feeds(ort, spec: dict) -> dict[str, np.ndarray]:
    """All arrays to feed: the spec's file, checkpoint parameters, zero buffers and reset flags."""
    feeds = load_arrays(spec["feeds"])
    if spec.get("from_checkpoint"):
        feeds.update(load_checkpoint_parameters(ort, spec["checkpoint"], spec["from_checkpoint"]))
    for buffer, param in spec.get("buffers", {}).items():
        feeds[buffer] = np.zeros_like(feeds[param])
    for flag in spec.get("flags", []):
        feeds[flag] = np.array([True])
    return feeds


def check_feeds(sess, feeds: dict[str, np.ndarray], where: str) -> None:
    """Every session input is fed with an array of its declared rank and fixed dims."""
    missing = [i.name for i in sess.get_inputs() if i.name not in feeds]
    if missing:
        raise RematError(f"{where}: nothing to feed input{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    for i in sess.get_inputs():
        arr = feeds[i.name]
        shape = i.shape or []
        ok = arr.ndim == len(shape) and all(not isinstance(d, int) or d == s for d, s in zip(shape, arr.shape))
        if not ok:
            raise RematError(
                f"{where}: input {i.name!r} is fed shape {tuple(arr.shape)}, the graph declares {tuple(shape)}"
            )
    names = {i.name for i in sess.get_inputs()}
    for extra in [k for k in feeds if k not in names]:
        del feeds[extra]


GRADIENT_FLAG_SUFFIX = ".accumulation.out"


class StepRunner:
    """One step, on CPU with numpy feeds or on CUDA with feeds bound once on the device.

    The gradients of a training graph are not among its outputs: ``InPlaceAccumulatorV2`` writes
    each into its ``<param>_grad.accumulation.buffer`` input in place and outputs only a bool
    flag (``<param>_grad.accumulation.out``, shape [1]). On CPU onnxruntime uses the memory of
    the numpy arrays fed, so the fed buffer arrays hold the gradients after the step; on CUDA the
    bound device buffers do. The profiling worker (:mod:`.profile`) runs its steps with it too.
    """

    def __init__(self, sess, feeds: dict[str, np.ndarray], buffers: dict[str, str], device_values=None):
        self.sess = sess
        self.feeds = feeds
        self.buffers = buffers
        self.output_names = [o.name for o in sess.get_outputs()]
        self.binding = None
        self._device_values: dict[str, Any] = device_values or {}
        if device_values is not None:
            self.binding = sess.io_binding()
            for name in feeds:
                self.binding.bind_ortvalue_input(name, self._device_values[name])
            for name in self.output_names:
                self.binding.bind_output(name, "cuda", 0)

    def run(self) -> None:
        """Run one step (what the step times measure)."""
        if self.binding is None:
            self._outs = self.sess.run(None, self.feeds)
        else:
            self.sess.run_with_iobinding(self.binding)
            self.binding.synchronize_outputs()

    def collect(self) -> dict[str, np.ndarray]:
        """Copies of the last step's graph outputs (accumulator flags left out) and each
        parameter's gradient as ``<param>_grad``, loss first."""
        if self.binding is None:
            outs = self._outs
            grads = {f"{p}_grad": self.feeds[b] for b, p in self.buffers.items()}
        else:
            outs = self.binding.copy_outputs_to_cpu()
            values = self._device_values or {}
            grads = {f"{p}_grad": values[b].numpy() for b, p in self.buffers.items()}
        result = {
            n: np.array(v, copy=True) for n, v in zip(self.output_names, outs) if not n.endswith(GRADIENT_FLAG_SUFFIX)
        }
        result.update({n: np.array(v, copy=True) for n, v in grads.items()})
        return result


def to_device(ort, feeds: dict[str, np.ndarray], device: str) -> dict | None:
    """Copies of the feeds on the GPU for ``cuda`` (bound once, so steps time no host copies); None on CPU."""
    if device != "cuda":
        return None
    try:
        return {name: ort.OrtValue.ortvalue_from_numpy(arr, "cuda", 0) for name, arr in feeds.items()}
    except Exception as exc:
        from onnx_remat.runtime.cuda import provider_failure_message

        raise EnvironmentProblem(provider_failure_message("", os.environ, reason=one_line(exc))) from None


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _scalar(arr) -> float | None:
    a = np.asarray(arr)
    return float(a.reshape(-1)[0]) if a.size == 1 else None


def run_arena(spec: dict, emit) -> dict:
    """The ``arena`` configuration: planned peak, arena size, step times, loss, profile, outputs."""
    ort = import_onnxruntime()
    device = spec["device"]
    workdir = Path(spec["workdir"])
    feeds = build_feeds(ort, spec)  # before the log capture: checkpoint loading makes arenas of its own
    on_device = to_device(ort, feeds, device)  # so does the binding's own CUDA allocator
    capture = Fd2Capture(workdir / "onnxruntime.log")
    try:
        ort.set_default_logger_severity(1)
        register_env_arena(ort, device)
        options = session_options(ort, kind="arena", workdir=workdir, profile=True, optimized_model=True)
        emit("session", 0, 1, None)

        def explain() -> str:
            from onnx_remat.runtime.cuda import provider_failure_message

            return provider_failure_message(capture.text(), os.environ)

        try:
            sess = create_session(ort, spec["model"], options, device, explain)
        except EnvironmentProblem:
            raise
        except Exception as exc:
            raise RematError(f"{spec['model']}: onnxruntime cannot load it: {runtime_message(exc)}") from None
        check_feeds(sess, feeds, spec["model"])
        if on_device is not None:
            on_device = {k: v for k, v in on_device.items() if k in feeds}
        runner = StepRunner(sess, feeds, spec.get("buffers", {}), on_device)
        start = capture.mark()
        first_end = None
        outputs: dict[str, np.ndarray] | None = None
        unstable: list[str] = []
        profile_path = None
        times: list[float] = []
        total = spec["warmup"] + spec["steps"]
        for i in range(total):
            ort.set_seed(int(spec["seed"]))
            t0 = time.perf_counter()
            try:
                runner.run()
            except Exception as exc:
                why = runtime_message(exc)
                raise RematError(f"{spec['model']}: onnxruntime failed in step {i + 1}: {why}") from None
            dt = time.perf_counter() - t0
            if i == 0:
                first_end = capture.mark()
                profile_path = sess.end_profiling()
                outputs = runner.collect()
            elif i == 1:
                # Same feeds, same seed: any difference is nondeterminism of the kernels
                # (e.g. GatherGrad's multithreaded scatter-add on CPU).
                again = runner.collect()
                previous = outputs or {}
                unstable = [n for n, v in again.items() if not _same_bits(v, previous[n])]
                del again
            if i >= spec["warmup"]:
                times.append(dt)
            emit("warmup" if i < spec["warmup"] else "step", i + 1, total, dt)
        log_all = capture.text()
        first_log = capture.text(start, first_end)
    finally:
        capture.close()
    arena_name = ARENA_NAMES[device]
    first_step = parse_arena_log(first_log, arena_name)
    whole = parse_arena_log(log_all, arena_name)
    if spec.get("save_outputs") and outputs is not None:
        save_arrays(workdir / "outputs.npz", outputs)
    first: np.ndarray | None = next(iter(outputs.values())) if outputs else None
    loss = _scalar(first) if first is not None else None
    return {
        "planned_peak_bytes": first_step.largest_request,
        "arena_peak_bytes": whole.total,
        "step_times": times,
        "loss": loss,
        "loss_finite": bool(np.all(np.isfinite(first))) if first is not None and first.dtype.kind == "f" else None,
        "output_names": list(outputs) if outputs else [],
        "unstable_outputs": unstable,
        "profile": str(profile_path) if profile_path else None,
        "optimized_model": str(workdir / "optimized.onnx") if (workdir / "optimized.onnx").exists() else None,
        "providers": sess.get_providers(),
        "onnxruntime": ort.__version__,
    }


def run_live(spec: dict, emit) -> dict:
    """The ``live`` configuration (CPU, no arena): peak RSS growth of each timed step."""
    ort = import_onnxruntime()
    feeds = build_feeds(ort, spec)
    options = session_options(ort, kind="live", workdir=spec["workdir"])
    emit("session", 0, 1, None)
    try:
        sess = create_session(ort, spec["model"], options, "cpu")
    except Exception as exc:
        raise RematError(f"{spec['model']}: onnxruntime cannot load it: {runtime_message(exc)}") from None
    check_feeds(sess, feeds, spec["model"])
    peaks: list[int | None] = []
    total = spec["warmup"] + spec["steps"]
    for i in range(total):
        ort.set_seed(int(spec["seed"]))
        t0 = time.perf_counter()
        try:
            if i < spec["warmup"]:
                outs = sess.run(None, feeds)
            else:
                with RssPeak() as peak:
                    outs = sess.run(None, feeds)
                peaks.append(peak.bytes)
        except Exception as exc:
            raise RematError(f"{spec['model']}: onnxruntime failed in step {i + 1}: {runtime_message(exc)}") from None
        del outs
        emit("warmup" if i < spec["warmup"] else "step", i + 1, total, time.perf_counter() - t0)
    known = [p for p in peaks if p is not None]
    return {
        "live_peak_bytes": max(known) if known else None,
        "live_peak_samples": peaks,
        "onnxruntime": ort.__version__,
    }


def run_outputs(spec: dict, emit) -> dict:
    """The ``outputs`` configuration: ``steps`` steps (default 1) with ``threads`` intra-op threads,
    the outputs of step k saved to ``outputs.npz`` (k = 1) and ``outputs-<k>.npz``.

    With one thread onnxruntime's CPU kernels are deterministic, so this is the reference when a
    graph's multithreaded outputs vary run to run. Several steps show what changes from step to
    step (seeded Dropouts draw new masks each step).
    """
    ort = import_onnxruntime()
    feeds = build_feeds(ort, spec)
    options = ort.SessionOptions()
    if spec.get("threads"):
        options.intra_op_num_threads = int(spec["threads"])
    emit("session", 0, 1, None)
    try:
        sess = create_session(ort, spec["model"], options, spec["device"])
    except EnvironmentProblem:
        raise
    except Exception as exc:
        raise RematError(f"{spec['model']}: onnxruntime cannot load it: {runtime_message(exc)}") from None
    check_feeds(sess, feeds, spec["model"])
    on_device = to_device(ort, feeds, spec["device"])
    runner = StepRunner(sess, feeds, spec.get("buffers", {}), on_device)
    steps = int(spec.get("steps") or 1)
    names: list[str] = []
    for k in range(1, steps + 1):
        ort.set_seed(int(spec["seed"]))
        t0 = time.perf_counter()
        try:
            runner.run()
            outputs = runner.collect()
        except Exception as exc:
            raise RematError(f"{spec['model']}: onnxruntime failed in step {k}: {runtime_message(exc)}") from None
        emit("step", k, steps, time.perf_counter() - t0)
        save_arrays(Path(spec["workdir"]) / ("outputs.npz" if k == 1 else f"outputs-{k}.npz"), outputs)
        names = list(outputs)
    return {"output_names": names, "onnxruntime": ort.__version__}


def serve(argv: list[str], run) -> int:
    """A worker process's protocol: read the spec (``argv[0]``), ``run(spec, emit)``, and write
    JSON lines to the original stdout: progress events, then the result or a one-line error.
    Shared by this module's runners and :mod:`onnx_remat.runtime.profile`."""
    # The protocol gets a private copy of stdout; anything else printed goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(obj: dict) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    def emit(phase: str, index: int, total: int, seconds: float | None) -> None:
        send({"progress": {"phase": phase, "index": index, "total": total, "seconds": seconds}})

    try:
        spec = json.loads(Path(argv[0]).read_text())
        send({"result": run(spec, emit)})
        return 0
    except RematError as exc:
        send({"error": {"exit_code": exc.exit_code, "kind": type(exc).__name__, "message": str(exc)}})
        return exc.exit_code
    except Exception as exc:
        traceback.print_exc()
        send({"error": {"exit_code": None, "kind": type(exc).__name__, "message": one_line(exc)}})
        return 1
    finally:
        proto.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point: read the spec, run the runner its ``kind`` names (:func:`serve`)."""
    runners = {"arena": run_arena, "live": run_live, "outputs": run_outputs}
    return serve(sys.argv[1:] if argv is None else argv, lambda spec, emit: runners[spec["kind"]](spec, emit))


if __name__ == "__main__":
    sys.exit(main())
