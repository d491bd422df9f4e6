"""benchmarks.realsize: its tables from recorded figures, and a whole run on a small model (the
real-size run itself is `python -m benchmarks.realsize`, hours on 2 cores; README "Real size")."""

from __future__ import annotations

import json

import pytest

from benchmarks import realsize
from benchmarks.realsize import main, measure_peers, render_model, render_summary

MiB = 2**20


def _report() -> dict:
    tool = {"wall_s": 12.3, "peak_rss_bytes": 3 * 2**30, "exit": 0, "timed_out": False, "error": None}
    rows = [
        {
            "config": "per-layer",
            "command": "onnx-remat apply ART --scope Block",
            "tool": tool,
            "estimate_after": 50 * MiB,
            "planned_before": 100 * MiB,
            "planned_after": 50 * MiB,
            "live_before": 110 * MiB,
            "live_after": 60 * MiB,
            "absolute_before": 900 * MiB,
            "absolute_after": 850 * MiB,
            "time_ratio": 1.31,
            "equal": True,
        },
        {"config": "lowest", "command": "onnx-remat apply ART --budget min", "tool": tool, "error": "exit 2"},
    ]
    peers = [
        {"config": "eager", "live_peak_bytes": 200 * MiB, "absolute_peak_bytes": 1200 * MiB, "step_time_s": 2.0},
        {"config": "checkpoint", "live_peak_bytes": 80 * MiB, "absolute_peak_bytes": 1100 * MiB, "step_time_s": 3.0},
        {"config": "compile:1.0", "live_peak_bytes": 150 * MiB, "absolute_peak_bytes": 1300 * MiB, "step_time_s": 1.0},
        {"config": "compile:match", "budget": 0.25, "live_peak_bytes": 70 * MiB, "step_time_s": 1.5},
        {"config": "sac", "error": "RuntimeError: no"},
    ]
    return {"model": "m", "description": "d", "nodes": 10, "rows": rows, "peers": peers}


def test_the_summary_puts_the_lowest_exact_peak_beside_compiles_lowest():
    report = _report()
    report["rows"][0]["live_before"] = 110 * MiB
    line = render_summary({"models": [report]}).splitlines()[2]
    # ours: the lowest exact live peak (per-layer, 60 MiB); compile's lowest: the matched row, 70 MiB
    assert line.startswith("| m | 110 MiB | 60.0 MiB, x1.31 (per-layer) | 200 MiB | 80.0 MiB, x1.50 ")
    assert line.endswith("| 70.0 MiB, x1.50 (budget 0.25) | yes |")


def test_each_row_says_what_ran_and_how_it_compares():
    lines = render_model(_report()).splitlines()
    assert lines[2].startswith("| onnxruntime, original | 100 MiB | 110 MiB | 900 MiB | x1.00 |")
    assert lines[3] == (
        "| onnx-remat per-layer (`--scope Block`) | 50.0 MiB | 60.0 MiB | 850 MiB | x1.31 | yes "
        "| 12.3 s, 3.00 GiB | exact |"
    )
    assert lines[4].startswith("| onnx-remat lowest | exit 2 |")
    # time ratios are to each runtime's own baseline: eager for checkpoint, compile at 1.0 for compile rows
    assert "| PyTorch `checkpoint` per layer | - | 80.0 MiB | 1,100 MiB | x1.50 |" in lines[6]
    assert "budget matched (0.25) | - | 70.0 MiB | - | x1.50 |" in lines[8]
    assert lines[9] == "| PyTorch selective checkpointing (matmuls saved) | cannot run here: RuntimeError: no ||||||"


def test_resume_measures_only_the_peers_an_earlier_run_missed(monkeypatch):
    """--resume: rows that ran are kept as they are; failed and missing ones (here the compile probes)
    are measured, and the matched budget is chosen among kept and new rows alike."""
    ran: list[str] = []

    def fake_peer_run(name, config, steps, timeout):
        ran.append(config)
        if not config.startswith("compile:"):
            return {"config": config, "live_peak_bytes": 300 * MiB, "step_time_s": 2.5}
        budget = float(config.split(":")[1])
        return {"config": config, "budget": budget, "live_peak_bytes": int(budget * 400) * MiB, "step_time_s": 1.0}

    monkeypatch.setattr(realsize, "peer_run", fake_peer_run)
    kept = [
        {"config": "eager", "live_peak_bytes": 500 * MiB, "step_time_s": 2.0},
        {"config": "sac", "error": "RuntimeError: no"},
        {"config": "compile:1.0", "budget": 1.0, "live_peak_bytes": 400 * MiB, "step_time_s": 1.0},
        {"config": "compile:0.5", "budget": 0.5, "live_peak_bytes": 200 * MiB, "step_time_s": 1.0},
        {"config": "compile:match", "error": "not measured: stopped for time"},
    ]
    monkeypatch.setattr(realsize, "MATCH_PROBES", (0.25, 0.1))
    rows = measure_peers("m", ["eager", "sac", "compile"], 1, 60 * MiB, 10.0, kept)
    # sac failed before: measured again; 0.25 is 100 MiB, above the target: 0.1 (40 MiB) is tried too
    assert ran == ["sac", "compile:0.25", "compile:0.1"]
    assert [r["config"] for r in rows] == ["eager", "sac", "compile:1.0", "compile:0.5", "compile:match"]
    assert rows[0] is kept[0]
    assert rows[-1]["budget"] == 0.1
    assert [b for b, _ in rows[-1]["probes"]] == [1.0, 0.5, 0.25, 0.1]


def test_tool_only_replaces_tool_figures_of_rewrites_that_are_the_same(monkeypatch, tmp_path):
    """--tool-only: each recorded apply runs again; only its time and RSS change, and a rewrite that
    no longer matches the recorded one (another estimate) is reported, its row left alone."""
    report = _report()
    report["model"] = "fc5"
    report["rows"].append({**report["rows"][0], "config": "budget 50%", "estimate_after": 70 * MiB})
    old_tool = report["rows"][0]["tool"]
    fresh = {"wall_s": 1.5, "peak_rss_bytes": 2**29, "exit": 0, "timed_out": False, "error": None}

    def fake_apply(cli, art, spec, label, budget, out, timeout):
        return {"config": label, "tool": fresh, "estimate_after": 50 * MiB}

    monkeypatch.setattr(realsize, "apply_config", fake_apply)
    monkeypatch.setattr(realsize, "ensure_artifacts", lambda spec, cache: (tmp_path, None))
    problems = realsize.refresh_tool_figures({"models": [report]}, tmp_path, 10.0)
    per_layer, lowest, budget = report["rows"]
    assert per_layer["tool"] is fresh and per_layer["estimate_after"] == 50 * MiB
    assert lowest["tool"] is old_tool  # it failed when recorded: not run again
    assert budget["tool"] is old_tool
    assert len(problems) == 1 and problems[0].startswith(
        "fc5 budget 50%: exit 0, estimate 52428800 (recorded 73400320)"
    )


@pytest.mark.timeout(300)
def test_a_whole_run_on_a_small_model(tmp_path, monkeypatch):
    """fc5 from the example artifacts: every onnx-remat row rewritten, run and bit-identical, the
    absolute step peak (Module + AdamW) measured, and PyTorch eager beside it."""
    from conftest import artifacts_dir

    out = tmp_path / "realsize"
    cache = artifacts_dir("fc5").parent
    assert main(["fc5", "--cache", str(cache), "--peers", "eager", "--steps", "1", "--out", str(out)]) == 0
    (report,) = json.loads(out.with_suffix(".json").read_text())["models"]
    rows = {r["config"]: r for r in report["rows"]}
    assert set(rows) == {"per-layer", "budget 50%", "lowest"}
    for r in rows.values():
        assert r["equal"], r
        assert r["planned_after"] < r["planned_before"]
        assert r["live_after"] < r["live_before"]
        assert r["absolute_after"] < r["absolute_before"]
        assert r["tool"]["wall_s"] > 0 and r["tool"]["peak_rss_bytes"] > 0
        assert r["estimate_after"] == r["planned_after"]
    assert rows["lowest"]["planned_after"] <= rows["per-layer"]["planned_after"]
    (eager,) = report["peers"]
    assert eager["error"] is None and eager["live_peak_bytes"] > 0 and eager["absolute_peak_bytes"] > 0
    assert render_model(report) in out.with_suffix(".md").read_text()


def test_readme_real_size_tables_are_the_recorded_run():
    """README's "Real size" tables are the rendering of benchmarks/results/realsize.json, model by
    model (`python -m benchmarks.realsize --render --readme` rewrites them)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    data = json.loads((root / "benchmarks" / "results" / "realsize.json").read_text())
    readme = (root / "README.md").read_text()
    assert data["models"]
    assert render_summary(data) in readme
    for report in data["models"]:
        assert render_model(report) in readme, report["model"]
    assert data["command"].split(", then ")[0].replace("python -m ", "") in readme.replace("python -m ", "")
