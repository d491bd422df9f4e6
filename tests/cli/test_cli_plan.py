"""``onnx-remat apply --budget`` and ``onnx-remat plan`` through the real console script."""

from __future__ import annotations

import json

from conftest import artifacts_dir, assert_one_line_error


def test_unreachable_budget_exits_1_with_the_floor_and_writes_nothing(cli, tmp_path):
    out = tmp_path / "out"
    proc = cli("apply", artifacts_dir("blocks10"), "--budget", "1MiB", "-o", out)
    assert_one_line_error(proc, "budget 1.0 MiB", "lowest planned peak", "nothing written")
    assert not out.exists()


def test_budget_and_selection_do_not_mix(cli, tmp_path):
    proc = cli("apply", artifacts_dir("blocks10"), "--budget", "60MiB", "--scope", "Block", "-o", tmp_path / "o")
    assert_one_line_error(proc, "not both", code=2)


def test_apply_budget_measured(cli, tmp_path):
    """The plan for 60 MiB runs in onnxruntime: planned peak within the budget, gradients bit-identical."""
    out = tmp_path / "b60"
    proc = cli(
        "apply", artifacts_dir("blocks10"), "--budget", "60MiB", "-o", out, "--measure", "--json", tmp_path / "s.json"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "budget met: measured planned peak" in proc.stdout
    assert "PASSED" in proc.stdout
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["measure"]["budget_met"] is True
    assert summary["measure"]["b"]["planned_peak_bytes"] <= 60 * 2**20
    # the estimate of the graph written (the chosen plan, scheduled) is what onnxruntime plans
    assert summary["budget"]["planned_peak_bytes"] == summary["measure"]["b"]["planned_peak_bytes"]
    assert summary["budget"]["planned_peak_bytes"] <= summary["budget"]["chosen"]["planned_peak_bytes"]


def test_plan_sweep_table_json_and_plot(cli, tmp_path):
    png = tmp_path / "curve.png"
    proc = cli("plan", artifacts_dir("fc5"), "--sweep", "--points", "4", "--plot", png, "--json", tmp_path / "c.json")
    assert proc.returncode == 0, proc.stderr
    assert "lowest reachable" in proc.stdout and "reference: per-layer" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((tmp_path / "c.json").read_text())
    peaks = [p["planned_peak_bytes"] for p in data["points"] if p["planned_peak_bytes"] is not None]
    assert len(peaks) >= 4 and all(p <= b["budget_bytes"] for p, b in zip(peaks, data["points"]))


def test_plan_needs_a_budget_or_sweep(cli):
    assert_one_line_error(cli("plan", artifacts_dir("fc5")), "--budget", code=2)
    assert_one_line_error(cli("plan", artifacts_dir("fc5"), "--budget", "40%", "--plot", "x.png"), "--sweep", code=2)
