"""Building onnxruntime sessions for one measured configuration (used inside the worker process).

Nothing here imports onnxruntime at module import: :func:`import_onnxruntime` does, on demand,
so the CLI starts fast. Two session kinds:

* ``arena``: the allocations go to one shared arena registered with the environment
  (``create_and_register_allocator`` for CPU, ``create_and_register_allocator_v2`` for CUDA) that
  grows by exactly what is asked (``arena_extend_strategy=1``), used by the session through the
  config entry ``session.use_env_allocators=1``; with the memory pattern on, the arena log then
  shows the planned activation block and the arena's real size;
* ``live`` (CPU only): no arena (``enable_cpu_mem_arena=False``), so freed buffers go back to
  malloc and the process's peak RSS follows the live bytes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from onnx_remat.errors import EnvironmentProblem

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
ARENA_NAMES = {"cpu": "Cpu", "cuda": "Cuda"}


def import_onnxruntime(*, block_torch: bool = True):
    """Import and return the ``onnxruntime`` module, or raise EnvironmentProblem.

    The training build's ``import onnxruntime`` imports torch (for ORTModule, ~2 s) although a
    plain ``InferenceSession`` needs none of it; with ``block_torch`` (worker processes, which
    never use torch) that import is made to fail fast, which onnxruntime tolerates.
    """
    if block_torch and "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise EnvironmentProblem(
            f"onnxruntime is not installed ({exc}); install onnx-remat[cpu] (or onnx-remat[cuda])"
        ) from None
    finally:
        if block_torch and sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    if not hasattr(ort, "InferenceSession"):
        raise EnvironmentProblem("the onnxruntime module found is incomplete; reinstall onnx-remat[cpu]")
    return ort


def register_env_arena(ort, device: str) -> None:
    """Register the shared exact-growth arena for ``device`` (``cpu`` or ``cuda``) with the environment."""
    cfg = ort.OrtArenaCfg({"arena_extend_strategy": 1})
    if device == "cpu":
        info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator(info, cfg)
    elif device == "cuda":
        info = ort.OrtMemoryInfo("Cuda", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator_v2(CUDA_PROVIDER, info, {"device_id": "0"}, cfg)
    else:  # pragma: no cover - measure() validates devices
        raise ValueError(device)


def session_options(
    ort,
    *,
    kind: str,
    workdir: str | os.PathLike,
    profile: bool = False,
    optimized_model: bool = False,
):
    """Session options for a measured configuration.

    ``kind`` is ``arena`` or ``live`` (see the module docstring). ``profile`` turns on
    onnxruntime's profiler (files under ``workdir``); ``optimized_model`` writes the graph after
    onnxruntime's optimizations to ``workdir/optimized.onnx``.
    """
    so = ort.SessionOptions()
    workdir = Path(workdir)
    if kind == "arena":
        so.add_session_config_entry("session.use_env_allocators", "1")
    elif kind == "live":
        so.enable_cpu_mem_arena = False
    else:  # pragma: no cover
        raise ValueError(kind)
    if profile:
        so.enable_profiling = True
        so.profile_file_prefix = str(workdir / "profile")
    if optimized_model:
        so.optimized_model_filepath = str(workdir / "optimized.onnx")
        # Large initializers go to a side file, so models over 2 GiB can be written too.
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.onnx.data")
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", str(1 << 20))
    return so


def providers(device: str) -> list:
    """The provider list for ``device``: CUDA (device 0) then CPU, or CPU alone."""
    if device == "cuda":
        return [(CUDA_PROVIDER, {"device_id": "0"}), CPU_PROVIDER]
    return [CPU_PROVIDER]


def create_session(ort, model_path: str | os.PathLike, options, device: str, explain=None):
    """An ``InferenceSession`` on ``device``; EnvironmentProblem if CUDA was asked for but not used.

    onnxruntime falls back to CPU (with a log line) when the CUDA provider cannot load;
    ``explain()``, when given, returns the one-line reason for the error (the worker reads it from
    the captured log, :func:`onnx_remat.runtime.cuda.provider_failure_message`).
    """
    if device == "cuda" and CUDA_PROVIDER not in ort.get_available_providers():
        raise EnvironmentProblem(
            "this onnxruntime build has no CUDA provider (the CPU build is installed); "
            "install onnx-remat[cuda] in a Python <= 3.11 environment"
        )
    sess = ort.InferenceSession(str(model_path), options, providers=providers(device))
    if device == "cuda" and sess.get_providers()[0] != CUDA_PROVIDER:
        raise EnvironmentProblem(explain() if explain else "the CUDA provider failed to load")
    return sess
