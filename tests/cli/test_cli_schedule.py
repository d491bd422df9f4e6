"""``onnx-remat schedule`` through the real console script: apply's output conventions, and a
written graph that loads and whose estimate is not above the input's."""

from __future__ import annotations

import json
import shutil

import onnx
from conftest import artifacts_dir, assert_one_line_error

from onnx_remat.estimate import estimate
from onnx_remat.graph import tags

ARTIFACT_FILES = ["checkpoint", "eval_model.onnx", "optimizer_model.onnx", "training_model.onnx"]


def _peak(path) -> int:
    return estimate(path, scope_table=False).before.planned_peak_bytes


def test_schedule_artifacts_directory_with_output_and_json(cli, tmp_path):
    out = tmp_path / "blocks10_scheduled"
    proc = cli("schedule", artifacts_dir("blocks10"), "-o", out, "--json", tmp_path / "s.json")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # rich wraps lines at the terminal's width
    assert "(chosen)" in text and "215.0 MiB -> 213.0 MiB" in text and f"wrote {out}" in text
    assert sorted(p.name for p in out.iterdir()) == ARTIFACT_FILES
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["output"] == str(out) and summary["model"] == str(artifacts_dir("blocks10"))
    assert summary["planned_peak_bytes_after"] < summary["planned_peak_bytes_before"] == 225443840
    written = onnx.load(str(out / "training_model.onnx"))
    onnx.checker.check_model(written)
    original = onnx.load(str(artifacts_dir("blocks10") / "training_model.onnx"))
    assert sorted(n.name for n in written.graph.node) == sorted(n.name for n in original.graph.node)
    assert not any(tags.is_clone_name(n.name) for n in written.graph.node)
    assert _peak(out) == summary["planned_peak_bytes_after"] <= _peak(artifacts_dir("blocks10"))


def test_schedule_default_output_force_and_the_input_never_overwritten(cli, tmp_path):
    src = tmp_path / "fc5"
    shutil.copytree(artifacts_dir("fc5"), src)
    before = (src / "training_model.onnx").read_bytes()
    proc = cli("schedule", src, "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "wrote fc5_scheduled"  # in the current directory; -q: nothing else
    assert sorted(p.name for p in (tmp_path / "fc5_scheduled").iterdir()) == ARTIFACT_FILES
    assert_one_line_error(cli("schedule", src, cwd=tmp_path), "fc5_scheduled", "give --force")
    assert cli("schedule", src, "-q", "--force", cwd=tmp_path).returncode == 0
    for force in ((), ("--force",)):
        assert_one_line_error(cli("schedule", src, "-o", src, *force), "this is the model", code=2)
    assert (src / "training_model.onnx").read_bytes() == before


def test_schedule_model_file_default_output(cli, tmp_path):
    src = tmp_path / "model.onnx"
    src.write_bytes((artifacts_dir("fc5") / "training_model.onnx").read_bytes())
    proc = cli("schedule", src, "--grad-accumulation", "early", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "model.scheduled.onnx"
    assert "wrote model.scheduled.onnx" in proc.stdout and out.is_file()
    assert _peak(out) <= _peak(src)
