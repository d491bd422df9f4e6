"""Measure what each node of a training graph costs: onnxruntime's profile of a few steps.

>>> from onnx_remat.runtime.profile import profile_costs
>>> data = profile_costs("models/artifacts/blocks10")        # runs onnxruntime once, then cached
>>> data["kernels"]["/blocks.0/MatMul/MatMulScaleFusion/"]     # seconds per step

``profile_costs`` runs ``warmup + steps`` training steps in a fresh process
(``python -m onnx_remat.runtime.profile SPEC.json``, the same protocol as the measuring worker)
with onnxruntime's profiler on, and averages every kernel's time over the steps after the
warm-up (:func:`onnx_remat.remat.cost.kernel_times`). The result is cached beside the training
graph (``training_model.onnx.remat-profile.json``, keyed by the graph's bytes) and reused while
the graph is unchanged; :func:`onnx_remat.remat.cost.node_costs` turns it into per-node costs.

Cache format::

    {"format": "onnx-remat cost profile 1", "fingerprint": "<sha256 of the graph, 16 hex>",
     "onnxruntime": "1.19.2", "runs": 3, "step_s": 0.25,
     "detail": "onnxruntime 1.19.2 profile, mean of 3 steps",
     "kernels": {"<onnxruntime node name>": seconds per step, ...}}
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from onnx_remat.errors import RematError, one_line
from onnx_remat.model_io import load_model, write_file
from onnx_remat.ortsim.registry import check_text
from onnx_remat.remat.cost import cache_path, kernel_times, model_fingerprint
from onnx_remat.runtime.inputs import prepare_feeds
from onnx_remat.runtime.measure import run_worker, worker_env

FORMAT = "onnx-remat cost profile 1"


def profile_costs(
    model: str | os.PathLike,
    *,
    steps: int = 3,
    warmup: int = 1,
    seed: int = 0,
    use_cache: bool = True,
    write_cache: bool = True,
) -> dict:
    """Kernel times of ``model`` (a training graph file or artifacts directory) from onnxruntime's
    profiler, cached beside the graph; see the module docstring for the format."""
    loaded = load_model(model, check=False)
    check_text(loaded.model, loaded.path)  # the feeds are made by name; onnxruntime judges the rest
    fingerprint = model_fingerprint(loaded.path.read_bytes())
    cached = cache_path(loaded.path)
    if use_cache and cached.is_file():
        try:
            data = json.loads(cached.read_text())
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict) and data.get("fingerprint") == fingerprint and isinstance(data.get("kernels"), dict):
            return data
    with tempfile.TemporaryDirectory(prefix="onnx-remat-profile-") as tmp:
        work = Path(tmp)
        feeds = prepare_feeds(loaded.model, seed=seed, synthesize_parameters=loaded.checkpoint_path is None)
        spec = {
            "kind": "profile",
            "model": str(loaded.path),
            "device": "cpu",
            "feeds": str(feeds.save(work / "feeds.npz")),
            "checkpoint": str(loaded.checkpoint_path) if loaded.checkpoint_path else None,
            "from_checkpoint": feeds.from_checkpoint,
            "buffers": feeds.buffers,
            "flags": feeds.flags,
            "seed": seed,
            "warmup": warmup,
            "steps": steps,
            "workdir": str(work),
        }
        env = dict(worker_env("cpu"))
        result = _run(spec, env)
    data = {
        "format": FORMAT,
        "fingerprint": fingerprint,
        "onnxruntime": result.get("onnxruntime"),
        "runs": result["runs"],
        "step_s": result["step_s"],
        "detail": f"onnxruntime {result.get('onnxruntime')} profile, mean of {result['runs']} steps",
        "kernels": result["kernels"],
    }
    if write_cache:
        # a read-only model folder: the profile is still used, just not kept
        with contextlib.suppress(OSError, RematError):
            write_file(cached, json.dumps(data, indent=1, sort_keys=True))
    return data


def _run(spec: dict, env: dict) -> dict:
    """Run this module as the worker (same JSON-lines protocol as :mod:`.worker`)."""
    from onnx_remat.runtime import measure

    saved = measure.worker_command
    measure.worker_command = lambda: [sys.executable, "-m", "onnx_remat.runtime.profile"]
    try:
        return run_worker(spec, env=env)
    finally:
        measure.worker_command = saved


def run_profile(spec: dict, emit) -> dict:
    """In the worker process: ``warmup + steps`` profiled steps; mean kernel times of the timed ones."""
    from onnx_remat.runtime.session import create_session, import_onnxruntime
    from onnx_remat.runtime.worker import StepRunner, build_feeds, check_feeds

    ort = import_onnxruntime()
    feeds = build_feeds(ort, spec)
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(spec["workdir"]) / "profile")
    emit("session", 0, 1, None)
    try:
        sess = create_session(ort, spec["model"], options, "cpu")
    except Exception as exc:
        raise RematError(f"{spec['model']}: onnxruntime cannot load it: {one_line(exc)}") from None
    check_feeds(sess, feeds, spec["model"])
    runner = StepRunner(sess, feeds, spec.get("buffers", {}))
    total = spec["warmup"] + spec["steps"]
    times = []
    for i in range(total):
        ort.set_seed(int(spec["seed"]))
        t0 = time.perf_counter()
        try:
            runner.run()
        except Exception as exc:
            raise RematError(f"{spec['model']}: onnxruntime failed in step {i + 1}: {one_line(exc)}") from None
        dt = time.perf_counter() - t0
        if i >= spec["warmup"]:
            times.append(dt)
        emit("warmup" if i < spec["warmup"] else "step", i + 1, total, dt)
    path = sess.end_profiling()
    events = json.loads(Path(path).read_text())
    kernels, runs = kernel_times(events, skip_runs=spec["warmup"])
    return {
        "kernels": kernels,
        "runs": runs,
        "step_s": sorted(times)[len(times) // 2] if times else None,
        "onnxruntime": ort.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    """Worker entry point: read the spec, profile, write one JSON result line to stdout."""
    from onnx_remat.runtime.worker import serve

    return serve(sys.argv[1:] if argv is None else argv, run_profile)


if __name__ == "__main__":
    sys.exit(main())
