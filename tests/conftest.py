"""Shared fixtures: paths of the example artifacts, a runner for the real console script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # models/ and benchmarks/ are repository folders, not installed

ARTIFACTS = ROOT / "models" / "artifacts"
MiB = 1024 * 1024


def artifacts_dir(name: str) -> Path:
    """The committed artifacts directory of example model ``name``."""
    return ARTIFACTS / name


def _console_script() -> list[str]:
    script = Path(sys.executable).with_name("onnx-remat")
    return [str(script)] if script.exists() else [sys.executable, "-m", "onnx_remat.cli.entry"]


@pytest.fixture
def cli(tmp_path_factory):
    """Run ``onnx-remat ARGS...`` as a user would (a fresh process); returns CompletedProcess.

    Without ``cwd`` it runs in a fresh empty folder, so a default output never lands in the
    repository."""

    def run(*args, cwd=None, env=None):
        full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
        return subprocess.run(
            _console_script() + [str(a) for a in args],
            capture_output=True,
            text=True,
            cwd=cwd if cwd is not None else tmp_path_factory.mktemp("cwd"),
            env=full_env,
            timeout=600,
        )

    return run


@pytest.fixture
def emulations(monkeypatch):
    """A one-item list counting the graphs emulated from here on: an emulation is counted where its
    :class:`~onnx_remat.ortsim.graph.RuntimeGraph` is made."""
    from onnx_remat.ortsim import graph

    made = [0]
    post_init = graph.RuntimeGraph.__post_init__

    def counted(self):
        made[0] += 1
        post_init(self)

    monkeypatch.setattr(graph.RuntimeGraph, "__post_init__", counted)
    return made


@pytest.fixture(scope="session")
def synthetic_dir(tmp_path_factory) -> Path:
    """Artifacts of a 4-block synthetic training graph (benchmarks/synthetic.py)."""
    from benchmarks.synthetic import training_artifacts

    return training_artifacts(4, tmp_path_factory.mktemp("synthetic4"), batch=4, seq=16, width=32)


def assert_one_line_error(proc, *fragments: str, code: int = 1) -> None:
    """The process failed with ``code``, printed one line mentioning ``fragments``, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    assert len(err.splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err, err


CORPUS_CACHE = ROOT / ".cache" / "corpus"


def _corpus_key() -> str:
    """Changes when anything that shapes the corpus exports changes: sources and library versions."""
    import hashlib
    from importlib import metadata

    h = hashlib.sha256()
    for rel in (
        "models/corpus.py",
        "models/__init__.py",
        "models/export.py",
        "onnx_remat/exporters.py",
        "onnx_remat/runtime/artifacts.py",
    ):
        h.update((ROOT / rel).read_bytes())
    for dist in ("torch", "transformers", "onnx", "onnxscript", "onnx-ir", "onnxruntime-training-cpu"):
        try:
            h.update(f"{dist}={metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist}=none".encode())
    return h.hexdigest()[:16]


@pytest.fixture(scope="session")
def corpus():
    """``corpus(name)``: the artifacts directory of corpus model ``name`` (models/corpus.py).

    Exported on first use into ``.cache/corpus/<key>/`` and reused by later runs while the key
    (export sources and library versions) is the same.
    """
    pytest.importorskip("transformers")
    from models.corpus import CORPUS, LARGE
    from models.export import export_artifacts

    cache = CORPUS_CACHE / _corpus_key()
    specs = {**CORPUS, **LARGE}

    def get(name: str) -> Path:
        path = cache / name
        if not (path / "training_model.onnx").is_file():
            export_artifacts(specs[name], cache)
        return path

    return get
