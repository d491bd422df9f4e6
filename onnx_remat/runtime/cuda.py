"""The CUDA path: is the CUDA build installed, is there a GPU, and where are its CUDA libraries.

The CUDA build of onnxruntime-training 1.19.2 (the ``onnxruntime-training`` package, CUDA 11.8,
cuDNN 8) loads ``libcudart.so.11.0``, ``libcublas.so.11``, ``libcublasLt.so.11``,
``libcudnn.so.8``, ``libcurand.so.10`` and ``libcufft.so.10`` when its CUDA provider starts. The
``cuda`` extra of onnx-remat installs them as the pip packages ``nvidia-*-cu11``, whose
``site-packages/nvidia/<name>/lib`` folders are not on the loader's path. The dynamic loader reads
``LD_LIBRARY_PATH`` only when a process starts, so the measuring worker is started with those
folders on it (:func:`worker_environment`); users set no paths.

Checks raise :class:`~onnx_remat.errors.EnvironmentProblem` (exit status 3) with one line:
the CPU build is installed (:func:`check_cuda_build`), there is no GPU (:func:`check_gpu`), the
provider did not load (:func:`provider_failure_message`, with the libraries ``ldd`` cannot find).

Not run on a GPU yet: the project's lent GPU machines have neither a package registry nor room for
the 300 MB wheel and its 2 GB of CUDA 11.8 libraries (see ``shared/notes/ort-1.19.md``).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import site
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from onnx_remat.errors import EnvironmentProblem

CUDA_DISTRIBUTION = "onnxruntime-training"
CPU_DISTRIBUTIONS = ("onnxruntime-training-cpu", "onnxruntime", "onnxruntime-gpu")
PROVIDER_LIBRARY = "libonnxruntime_providers_cuda.so"


def installed_runtime() -> tuple[str, str] | None:
    """``(distribution, version)`` of the installed onnxruntime package, or None (no import)."""
    for name in (CUDA_DISTRIBUTION, *CPU_DISTRIBUTIONS):
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def onnxruntime_dir() -> Path | None:
    """The folder of the ``onnxruntime`` package, found without importing it."""
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def provider_library() -> Path | None:
    """``onnxruntime/capi/libonnxruntime_providers_cuda.so`` if this build has it."""
    root = onnxruntime_dir()
    if root is None:
        return None
    lib = root / "capi" / PROVIDER_LIBRARY
    return lib if lib.is_file() else None


def site_dirs() -> list[Path]:
    """Where pip puts packages for this interpreter: site-packages folders, then sys.path."""
    dirs: list[str] = []
    with contextlib.suppress(AttributeError):  # virtualenv's old site module lacks them
        dirs.extend(site.getsitepackages())
    with contextlib.suppress(AttributeError):
        dirs.append(site.getusersitepackages())
    dirs.extend(p for p in sys.path if p)
    seen: set[Path] = set()
    out: list[Path] = []
    for d in dirs:
        p = Path(d)
        if p.is_dir() and p.resolve() not in seen:
            seen.add(p.resolve())
            out.append(p)
    return out


def nvidia_library_dirs(search: Iterable[str | os.PathLike] | None = None) -> list[Path]:
    """The ``nvidia/<package>/lib`` folders holding shared libraries, under the given site folders.

    ``search`` defaults to :func:`site_dirs`. Folders are returned once each, sorted by package
    name within a site folder, site folders in the order given.
    """
    out: list[Path] = []
    seen: set[Path] = set()
    for base in search if search is not None else site_dirs():
        root = Path(base) / "nvidia"
        if not root.is_dir():
            continue
        for lib in sorted(root.glob("*/lib")):
            if lib.is_dir() and any(".so" in f.name for f in lib.iterdir()):
                key = lib.resolve()
                if key not in seen:
                    seen.add(key)
                    out.append(lib)
    return out


def worker_environment(
    base: Mapping[str, str] | None = None, search: Iterable[str | os.PathLike] | None = None
) -> dict[str, str]:
    """A copy of ``base`` (default ``os.environ``) with the nvidia library folders first on ``LD_LIBRARY_PATH``."""
    env = dict(os.environ if base is None else base)
    dirs = [str(d) for d in nvidia_library_dirs(search)]
    old = [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    merged = dirs + [p for p in old if p not in dirs]
    if merged:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(merged)
    return env


def missing_libraries(library: str | os.PathLike, env: Mapping[str, str] | None = None) -> list[str]:
    """Libraries ``ldd`` reports as ``not found`` for ``library`` under ``env``; [] if ldd is absent."""
    if shutil.which("ldd") is None:
        return []
    try:
        out = subprocess.run(
            ["ldd", str(library)],
            env=dict(env) if env is not None else None,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [m.group(1) for m in re.finditer(r"^\s*(\S+) => not found", out, re.MULTILINE)]


def check_cuda_build() -> None:
    """Raise EnvironmentProblem unless the CUDA build of onnxruntime-training is installed."""
    found = installed_runtime()
    if found is None:
        raise EnvironmentProblem(
            "device cuda needs the CUDA build of onnxruntime-training: pip install 'onnx-remat[cuda]' "
            "(no onnxruntime is installed)"
        )
    name, version = found
    if name != CUDA_DISTRIBUTION or provider_library() is None:
        raise EnvironmentProblem(
            f"device cuda needs the CUDA build of onnxruntime-training, but {name} {version} (CPU only) "
            "is installed: pip install 'onnx-remat[cuda]' in a Python 3.10/3.11 environment of its own"
        )


def check_gpu() -> None:
    """Raise EnvironmentProblem unless ``nvidia-smi`` lists a GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise EnvironmentProblem("device cuda: no NVIDIA GPU here (nvidia-smi not found)")
    try:
        proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise EnvironmentProblem(f"device cuda: nvidia-smi failed ({exc})") from None
    if proc.returncode != 0 or "GPU" not in proc.stdout:
        detail = (proc.stdout + proc.stderr).strip().splitlines()
        raise EnvironmentProblem(
            "device cuda: no usable NVIDIA GPU (nvidia-smi: "
            + (detail[0] if detail else f"exit {proc.returncode}")
            + ")"
        )


def check_cuda_ready() -> None:
    """Both checks: the CUDA build first (the more likely fix), then the GPU."""
    check_cuda_build()
    check_gpu()


def provider_failure_message(log_text: str, env: Mapping[str, str] | None = None, reason: str | None = None) -> str:
    """One line saying why the CUDA provider did not load: ``reason`` or onnxruntime's log line
    about it, and the libraries ``ldd`` cannot find for the provider library."""
    for line in log_text.splitlines() if reason is None else ():
        if ("[E:" in line or "[W:" in line) and ("CUDA" in line or "cuda" in line):
            reason = re.sub(r"^.*?\] ", "", line).strip()
            break
    parts = ["the CUDA provider failed to load"]
    if reason:
        parts.append(reason[:300])
    lib = provider_library()
    if lib is not None:
        missing = missing_libraries(lib, env)
        if missing:
            parts.append("libraries not found: " + ", ".join(missing) + " (reinstall onnx-remat[cuda])")
    return "; ".join(parts)
