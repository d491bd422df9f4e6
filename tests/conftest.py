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
    return [str(script)] if script.exists() else [sys.executable, "-m", "onnx_remat.cli.main"]


@pytest.fixture
def cli():
    """Run ``onnx-remat ARGS...`` as a user would (a fresh process); returns CompletedProcess."""

    def run(*args, cwd=None, env=None):
        full_env = dict(os.environ, COLUMNS="200", **(env or {}))
        return subprocess.run(
            _console_script() + [str(a) for a in args],
            capture_output=True,
            text=True,
            cwd=cwd,
            env=full_env,
            timeout=600,
        )

    return run


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
