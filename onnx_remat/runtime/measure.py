"""Measure one training step of a training graph with onnxruntime-training: memory, time, loss.

:func:`measure` runs each configuration in a fresh worker process (:mod:`.worker`; an arena never
shrinks, so one process can measure one configuration only):

1. ``arena``: the session allocates from one shared arena that grows by exactly what is asked.
   The first step is profiled and the arena's log captured. Figures: ``planned_peak_bytes``, the
   largest allocation that grew the arena during the first step, which with the memory pattern on
   is the one block onnxruntime's planner sized for all activations of a step (null if no
   allocation grew the arena: activations that fit in memory freed during initialization); and
   ``arena_peak_bytes``, the arena's size at the end (initialization included). Then the timed
   steps: ``step_time_s`` (wall clock of ``run`` alone). Peaks are byte-identical run to run.
2. ``live`` (CPU only): no arena; glibc told to give large blocks back at once
   (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``). After the warm-up, ``live_peak_bytes``
   is the largest growth of the process's peak RSS (``VmHWM`` after the step minus ``VmRSS``
   before, with the high-water mark reset through ``/proc/self/clear_refs``) over the timed
   steps: what the step really touched. Run to run it varies by 100-200 KiB (buffers of the
   thread pool), under 1% from some 20 MiB of activations up.

Parameters come from the artifacts checkpoint (a ``checkpoint`` file beside the graph, or
``checkpoint=``), else are synthesized deterministically; data inputs are synthesized from the
seed or read from an ``.npz`` (:mod:`.inputs`). ``onnxruntime.set_seed(seed)`` before each step
makes dropout repeatable, so every step computes the same outputs. A training graph's gradients
are not graph outputs (``<param>_grad.accumulation.out`` is a bool flag): onnxruntime writes
each into its ``<param>_grad.accumulation.buffer`` input in place, where the worker reads it.

It also checks what onnxruntime kept of an onnx-remat rewrite (:mod:`.kept`).

JSON (:meth:`Measurement.to_json`, ``onnx-remat measure --json``)::

    {
      "model": "models/artifacts/blocks10/training_model.onnx",
      "device": "cpu",                     # or "cuda"
      "steps": 3, "warmup": 1, "seed": 0,  # timed steps, untimed steps before them
      "checkpoint": ".../checkpoint",      # null: parameters synthesized
      "planned_peak_bytes": 225443840,     # int or null (see above)
      "arena_peak_bytes": 229642752,       # int or null
      "live_peak_bytes": 227549184,        # int or null (null on CUDA, or --no-live)
      "live_peak_samples": [227500032, ...],  # per timed step of the live worker
      "step_time_s": {"median": 0.68, "min": 0.66, "max": 0.68, "samples": [...]},
      "loss": 9.141008,                    # first graph output (float, or null if not a scalar)
      "outputs": ["<loss output>", "blocks.0.y_grad", ...],  # compared by compare(): graph
                                           # outputs but the accumulator flags, then one
                                           # "<param>_grad" per parameter
      "unstable_outputs": [],              # outputs the second step computed differently from
                                           # the first (same feeds and seed): nondeterministic
                                           # kernels, e.g. GatherGrad with several threads
      "inputs": {"x": {"shape": [8, 128, 16, 32], "dtype": "float32",
                       "source": "synthesized" | "file" | "checkpoint",
                       "int_range": [0, 512] | null, "range_source": "..." | null}, ...},
      "rewrite": {                         # what onnxruntime kept of an onnx-remat rewrite
        "clones_in_model": 100, "clones_kept": 71,  # clone nodes in the file / in the optimized
                                           # graph (own name, or a fusion named after it)
        "barriers_in_model": 10, "barriers_kept": 10,
        "clones_ran": 71,                  # clones in the profiled step's execution order
        "executed_nodes": 299,
        "forward_end_node": "onnx::Pow::5", "forward_end_position": 86,
        "segments": [{"label": "blocks.0", "barrier": "remat_barrier/blocks.0",
                      "clones": 10, "clones_kept": 8, "clones_ran": 8, "barrier_kept": true,
                      "triggers": ["/blocks.0/MatMul_1_output_0_grad"],
                      "trigger_nodes": ["AccumulateGrad_/blocks.0/MatMul_1_output_0_grad"],
                      "first_clone_position": 282, "trigger_position": 280,
                      "ran_after_trigger": true, "ran_after_forward": true}, ...],
        "notes": []
      },
      "providers": ["CPUExecutionProvider"], "onnxruntime": "1.19.2",
      "notes": []
    }

Counts ``*_kept`` / ``clones_ran`` and positions are null where onnxruntime wrote no optimized
graph or profile; ``ran_after_*`` is null when no clone ran.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from onnx_remat.errors import EnvironmentProblem, RematError, UsageError
from onnx_remat.model_io import check_dim_names
from onnx_remat.remat.seed_check import seeded_dropouts
from onnx_remat.runtime.inputs import InputInfo, load_arrays, prepare_feeds
from onnx_remat.runtime.kept import RewriteCheck, check_rewrite
from onnx_remat.runtime.memory import LIVE_MALLOC_ENV
from onnx_remat.runtime.prepared import (
    FORWARD_ONLY_NOTE,
    PreparedModel,
    Workdir,
    check_checkpoint,
    model_source,
)

DEVICES = ("cpu", "cuda")


@dataclass
class StepTimes:
    """Wall-clock seconds of the timed steps: median, min, max and every sample."""

    median: float | None
    min: float | None
    max: float | None
    samples: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, samples: list[float]) -> StepTimes:
        """Summary of a list of step times (all None when empty)."""
        if not samples:
            return cls(None, None, None, [])
        return cls(statistics.median(samples), min(samples), max(samples), list(samples))

    def to_json(self) -> dict:
        """``{"median", "min", "max", "samples"}``."""
        return {"median": self.median, "min": self.min, "max": self.max, "samples": self.samples}


@dataclass
class ProgressEvent:
    """A worker's report while it runs: which model and configuration, phase, step k of n."""

    model: str
    tag: str  # "" for measure; "A" or "B" for compare
    config: str  # "arena" or "live"
    phase: str  # "session", "warmup", "step"
    index: int
    total: int
    seconds: float | None


ProgressCallback = Callable[[ProgressEvent], None]


@dataclass
class Measurement:
    """The figures of one measured training graph (see the module docstring for their meaning)."""

    model: str
    device: str
    steps: int
    warmup: int
    seed: int
    checkpoint: str | None
    planned_peak_bytes: int | None
    arena_peak_bytes: int | None
    live_peak_bytes: int | None
    step_time_s: StepTimes
    loss: float | None
    inputs: dict[str, InputInfo]
    rewrite: RewriteCheck
    output_names: list[str] = field(default_factory=list)
    unstable_outputs: list[str] = field(default_factory=list)
    live_peak_samples: list[int | None] = field(default_factory=list)
    providers: list[str] = field(default_factory=list)
    onnxruntime: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        """The JSON object documented in this module's docstring."""
        return {
            "model": self.model,
            "device": self.device,
            "steps": self.steps,
            "warmup": self.warmup,
            "seed": self.seed,
            "checkpoint": self.checkpoint,
            "planned_peak_bytes": self.planned_peak_bytes,
            "arena_peak_bytes": self.arena_peak_bytes,
            "live_peak_bytes": self.live_peak_bytes,
            "live_peak_samples": self.live_peak_samples,
            "step_time_s": self.step_time_s.to_json(),
            "loss": self.loss,
            "outputs": self.output_names,
            "unstable_outputs": self.unstable_outputs,
            "inputs": {k: v.to_json() for k, v in self.inputs.items()},
            "rewrite": self.rewrite.to_json(),
            "providers": self.providers,
            "onnxruntime": self.onnxruntime,
            "notes": self.notes,
        }


# -- the arguments ---------------------------------------------------------------------------------


def check_run_args(device: str, steps: int, warmup: int) -> None:
    """The arguments of :func:`measure` and :func:`~.compare.compare` that every run shares:
    UsageError for an unknown device or fewer than one step or warm-up step; for ``cuda``, the CUDA
    build and a GPU are checked (EnvironmentProblem)."""
    if device not in DEVICES:
        raise UsageError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if steps < 1:
        raise UsageError(f"steps must be at least 1, got {steps}")
    if warmup < 1:
        raise UsageError(f"warmup must be at least 1 (the first step is the profiled one), got {warmup}")
    if device == "cuda":
        from onnx_remat.runtime.cuda import check_cuda_ready

        check_cuda_ready()


# -- workers ---------------------------------------------------------------------------------------


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def worker_env(device: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a worker starts with: the CUDA libraries on LD_LIBRARY_PATH for ``cuda``,
    this package importable, and ``extra`` on top."""
    if device == "cuda":
        from onnx_remat.runtime.cuda import worker_environment

        env = worker_environment()
    else:
        env = dict(os.environ)
    root = _package_root()
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        env["PYTHONPATH"] = os.pathsep.join([root, *parts])
    env.update(extra or {})
    return env


def worker_command() -> list[str]:
    """How a worker process is started (this interpreter, the worker module); tests replace it."""
    return [sys.executable, "-m", "onnx_remat.runtime.worker"]


_NO_DRIVER_MARKS = ("CUDADriverWrapper", "libcuda.so", "CUDA driver", "no CUDA-capable device", "cudaErrorNoDevice")


def run_worker(
    spec: dict,
    *,
    env: Mapping[str, str] | None = None,
    progress: Callable[[dict], None] | None = None,
) -> dict:
    """Run :mod:`.worker` on ``spec`` in a fresh process; return its result.

    Progress lines are passed to ``progress``. The worker's error comes back as the same
    :class:`RematError` subclass (by exit status); a worker that dies without a word (killed for
    memory, crashed) gives a RematError with its exit status and last line of stderr.
    """
    workdir = Path(spec["workdir"])
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path = workdir / f"spec-{spec['kind']}.json"
    spec_path.write_text(json.dumps(spec))
    stderr_path = workdir / f"stderr-{spec['kind']}.txt"
    result = error = None
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(
            [*worker_command(), str(spec_path)],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            text=True,
        )
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                try:
                    msg = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if "progress" in msg and progress is not None:
                    progress(msg["progress"])
                elif "result" in msg:
                    result = msg["result"]
                elif "error" in msg:
                    error = msg["error"]
            proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    if error is not None:
        code = error.get("exit_code")
        if code == EnvironmentProblem.exit_code:
            raise EnvironmentProblem(error["message"])
        if code is None:
            raise RuntimeError(f"measuring worker failed: {error.get('kind')}: {error['message']} (see {stderr_path})")
        raise RematError(error["message"])
    if result is None:
        text = stderr_path.read_text(errors="replace")
        tail = [ln for ln in text.splitlines() if ln.strip()]
        how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}"
        if spec.get("device") == "cuda" and any(m in text for m in _NO_DRIVER_MARKS):
            # The CUDA provider loaded (its libraries resolved) but found no driver or device: it
            # aborts the process from a constructor (seen with onnxruntime-training 1.19.2).
            raise EnvironmentProblem(
                f"device cuda: the CUDA provider loaded but no NVIDIA driver or GPU is usable ({how}): "
                + (tail[-1].strip()[:300] if tail else "")
            )
        hint = " (out of memory?)" if proc.returncode in (-9, 137) else ""
        raise RematError(f"the measuring process died ({how}){hint}" + (f": {tail[-1][:300]}" if tail else ""))
    return result


# -- measuring -------------------------------------------------------------------------------------


def measure_prepared(
    prep: PreparedModel,
    *,
    device: str,
    steps: int,
    warmup: int,
    seed: int,
    live: bool,
    workdir: Path,
    progress: ProgressCallback | None,
    save_outputs: bool = False,
    tag: str = "",
) -> tuple[Measurement, dict[str, np.ndarray] | None]:
    """Measure ``prep`` in its worker processes under ``workdir``: the ``arena`` worker, then the
    ``live`` one (with ``live``, on CPU). Returns the :class:`Measurement` and, with
    ``save_outputs``, the first step's outputs (None otherwise). ``tag`` names the graph in the
    progress events (``"A"``/``"B"`` for compare)."""
    src = prep.source
    base = {**_worker_base(prep, device, seed), "warmup": warmup, "steps": steps}

    def relay(config: str):
        return _relay(progress, src.label, tag, config)

    arena_dir = workdir / "arena"
    arena = run_worker(
        {**base, "kind": "arena", "workdir": str(arena_dir), "save_outputs": save_outputs},
        env=worker_env(device),
        progress=relay("arena"),
    )
    if arena.get("loss_finite") is False:
        raise RematError(
            f"{src.label}: the loss is not finite ({arena.get('loss')}) after one step; check the inputs "
            "(--inputs, --int-range) and the parameters"
        )
    live_result: dict = {}
    notes: list[str] = []
    if live and device == "cpu":
        live_result = run_worker(
            {**base, "kind": "live", "workdir": str(workdir / "live")},
            env=worker_env(device, LIVE_MALLOC_ENV),
            progress=relay("live"),
        )
        if live_result.get("live_peak_bytes") is None:
            notes.append("live peak not measured: /proc/self/clear_refs is not available here")
    elif device != "cpu":
        notes.append("live peak is measured on CPU only; on CUDA the arena peak is the device footprint")
    unstable = arena.get("unstable_outputs", [])
    if unstable and seeded_dropouts(src.model):
        notes.append(
            f"{len(unstable)} outputs change from step to step by design: seeded Dropouts (dropout=seed) draw new "
            "masks each step"
        )
    elif unstable:
        notes.append(
            f"{len(unstable)} outputs differ between two steps with the same inputs and seed "
            f"(nondeterministic kernels): {', '.join(unstable[:5])}{' ...' if len(unstable) > 5 else ''}"
        )
    if arena.get("planned_peak_bytes") is None:
        notes.append("no allocation grew the arena during the first step: planned peak unknown")

    rewrite = check_rewrite(src.model, arena.get("optimized_model"), arena.get("profile"))
    info = dict(prep.feeds.info)
    for name in prep.feeds.from_checkpoint:
        gi = next(p for p in prep.feeds.inputs.parameters if p.name == name)
        info[name] = InputInfo(
            tuple(d if isinstance(d, int) else -1 for d in (gi.dims or ())), gi.type_name, "checkpoint"
        )
    m = Measurement(
        model=src.label,
        device=device,
        steps=steps,
        warmup=warmup,
        seed=seed,
        checkpoint=str(src.checkpoint) if src.checkpoint and prep.feeds.from_checkpoint else None,
        planned_peak_bytes=arena.get("planned_peak_bytes"),
        arena_peak_bytes=arena.get("arena_peak_bytes"),
        live_peak_bytes=live_result.get("live_peak_bytes"),
        live_peak_samples=live_result.get("live_peak_samples", []),
        step_time_s=StepTimes.of(arena.get("step_times", [])),
        loss=arena.get("loss"),
        inputs=info,
        rewrite=rewrite,
        output_names=arena.get("output_names", []),
        unstable_outputs=unstable,
        providers=arena.get("providers", []),
        onnxruntime=arena.get("onnxruntime"),
        notes=notes,
    )
    outputs = None
    if save_outputs and (arena_dir / "outputs.npz").exists():
        outputs = load_arrays(arena_dir / "outputs.npz")
    return m, outputs


def reference_outputs(
    prep: PreparedModel, *, device: str, seed: int, workdir: Path, progress: ProgressCallback | None, tag: str = ""
) -> dict[str, np.ndarray]:
    """Outputs of one single-threaded step (deterministic on CPU), from a worker of its own."""
    return step_outputs(prep, device=device, seed=seed, workdir=workdir, progress=progress, tag=tag, steps=1)[0]


def step_outputs(
    prep: PreparedModel,
    *,
    device: str,
    seed: int,
    workdir: Path,
    progress: ProgressCallback | None,
    tag: str = "",
    steps: int = 1,
) -> list[dict[str, np.ndarray]]:
    """Outputs of each of ``steps`` single-threaded steps in one fresh worker (step 1 first)."""
    run_worker(
        {**_worker_base(prep, device, seed), "kind": "outputs", "threads": 1, "steps": steps, "workdir": str(workdir)},
        env=worker_env(device),
        progress=_relay(progress, prep.source.label, tag, "outputs"),
    )
    return [load_arrays(workdir / ("outputs.npz" if k == 1 else f"outputs-{k}.npz")) for k in range(1, steps + 1)]


def _worker_base(prep: PreparedModel, device: str, seed: int) -> dict:
    """The part of a worker spec every configuration shares: graph, device, feeds, parameters, seed."""
    src = prep.source
    return {
        "model": str(src.path),
        "device": device,
        "feeds": str(prep.feeds_path),
        "checkpoint": str(src.checkpoint) if src.checkpoint else None,
        "from_checkpoint": prep.feeds.from_checkpoint,
        "buffers": prep.feeds.buffers,
        "flags": prep.feeds.flags,
        "seed": seed,
    }


def _relay(progress: ProgressCallback | None, label: str, tag: str, config: str):
    """A worker progress callback that forwards to ``progress`` as ProgressEvents (None without one)."""
    if progress is None:
        return None
    return lambda p: progress(ProgressEvent(label, tag, config, p["phase"], p["index"], p["total"], p["seconds"]))


def measure(
    model: str | os.PathLike | onnx.ModelProto,
    *,
    device: str = "cpu",
    steps: int = 3,
    warmup: int = 1,
    dims: Mapping[str, int] | None = None,
    inputs: str | os.PathLike | Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
    int_ranges: Mapping[str, tuple[int, int]] | None = None,
    checkpoint: str | os.PathLike | None = None,
    live: bool = True,
    progress: ProgressCallback | None = None,
) -> Measurement:
    """Measure ``warmup + steps`` training steps of ``model`` (see the module docstring).

    ``model``: a training graph file, an artifacts directory, or a ModelProto (written to a
    temporary file; give ``checkpoint`` for its parameters). ``dims`` binds symbolic dimensions;
    ``inputs`` is an ``.npz`` (or dict) of data inputs; ``int_ranges`` overrides the ``[low, high)``
    of integer inputs; ``live=False`` skips the live-peak worker; ``progress`` receives a
    :class:`ProgressEvent` per step. Raises RematError (bad input, non-finite loss),
    UsageError (bad arguments) or EnvironmentProblem (no CUDA build or GPU).
    """
    check_run_args(device, steps, warmup)
    with Workdir("onnx-remat-measure-") as tmp:
        src = model_source(model, checkpoint, tmp, "model")
        check_dim_names(src.model, dims, src.label)
        check_checkpoint(src.checkpoint)
        feeds = prepare_feeds(
            src.model,
            dims=dims,
            inputs=inputs,
            seed=seed,
            int_ranges=int_ranges,
            synthesize_parameters=src.checkpoint is None,
        )
        prep = PreparedModel(src, feeds, feeds.save(tmp / "feeds.npz"))
        m, _ = measure_prepared(
            prep,
            device=device,
            steps=steps,
            warmup=warmup,
            seed=seed,
            live=live,
            workdir=tmp / "run",
            progress=progress,
        )
        if src.checkpoint is None and feeds.inputs.parameters:
            m.notes.append("no checkpoint: parameters synthesized")
        if src.forward_only:
            m.notes.append(FORWARD_ONLY_NOTE)
        return m
