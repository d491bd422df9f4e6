"""The CUDA extra, as far as a machine without a GPU can check it.

Installing ``onnx-remat[cuda]`` downloads ~3 GB (onnxruntime-training's CUDA build and the CUDA 11.8
/ cuDNN 8 libraries), so this test runs against a virtualenv made beforehand and named by
``ONNX_REMAT_CUDA_VENV``::

    python3.11 -m venv /tmp/cudavenv && /tmp/cudavenv/bin/pip install -e '.[cuda]'
    ONNX_REMAT_CUDA_VENV=/tmp/cudavenv make test-all

It checks, inside that virtualenv, what onnx-remat does before it can use a GPU: the CUDA build is
the installed runtime and offers CUDAExecutionProvider; the nvidia library folders onnx-remat puts
on the worker's LD_LIBRARY_PATH resolve every library the CUDA provider loads (``ldd``), while
without them some are missing; and asking for ``--device cuda`` without a GPU is exit status 3
with one line.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, artifacts_dir

VENV = os.environ.get("ONNX_REMAT_CUDA_VENV")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not VENV, reason="set ONNX_REMAT_CUDA_VENV to a virtualenv with onnx-remat[cuda]"),
]

_PROBE = r"""
import json, os
from onnx_remat.runtime import cuda
lib = cuda.provider_library()
env = cuda.worker_environment(dict(os.environ))
print(json.dumps({
    "runtime": cuda.installed_runtime(),
    "provider_library": str(lib) if lib else None,
    "library_dirs": [str(d) for d in cuda.nvidia_library_dirs()],
    "missing_without": cuda.missing_libraries(lib, {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}),
    "missing_with": cuda.missing_libraries(lib, env),
}))
"""


def _python() -> str:
    return str(Path(VENV) / "bin" / "python")


def test_cuda_build_installed_and_its_libraries_resolve():
    proc = subprocess.run([_python(), "-c", _PROBE], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    probe = json.loads(proc.stdout.strip().splitlines()[-1])
    assert probe["runtime"][0] == "onnxruntime-training"
    assert probe["provider_library"] and probe["provider_library"].endswith("libonnxruntime_providers_cuda.so")
    assert probe["library_dirs"], "no nvidia/*/lib folders found"
    assert probe["missing_without"], "expected the CUDA libraries to be missing without onnx-remat's paths"
    assert probe["missing_with"] == []


def test_cuda_device_without_a_gpu_is_exit_3():
    cli = Path(VENV) / "bin" / "onnx-remat"
    proc = subprocess.run(
        [str(cli), "measure", artifacts_dir("fc5"), "--device", "cuda", "--steps", "1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
