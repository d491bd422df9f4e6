"""benchmarks.apply_scale keeps README's scale table honest: the table README shows is the
rendering of the recorded JSON, and the benchmark itself runs end to end on a small graph."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.apply_scale import COMMANDS, main, render, run_measured

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "scale.json"


def test_readme_scale_table_is_the_recorded_run():
    data = json.loads(RESULTS.read_text())
    table = render(data["rows"])
    readme = (ROOT / "README.md").read_text()
    assert table in readme, "README's scale table differs from benchmarks/results/scale.json: rerun --render and copy"
    md = (ROOT / "benchmarks" / "results" / "scale.md").read_text()
    assert table in md
    # every recorded row ran every command users run, and says how long and how much memory
    for row in data["rows"]:
        assert set(row["commands"]) == set(COMMANDS), row["nodes"]
        for r in row["commands"].values():
            assert r["wall_s"] > 0 and (r["peak_rss_bytes"] > 0 or r["timed_out"])


def test_a_command_s_peak_rss_is_its_own_not_the_benchmark_s():
    """Linux starts a child's ru_maxrss at its parent's peak: a driver holding memory must not
    lend it to the command it measures (realsize's driver holds gigabytes)."""
    import sys

    import numpy as np

    held = np.ones(2**26)  # 512 MiB in this process, touched
    small = run_measured([sys.executable, "-c", "pass"], 60)
    big = run_measured([sys.executable, "-c", "b = bytearray(300 * 2**20)\nb[::4096] = bytes(len(b[::4096]))"], 60)
    assert held.sum() == 2**26
    assert small["exit"] == 0 and 0 < small["peak_rss_bytes"] < 100 * 2**20, small
    assert big["exit"] == 0 and big["peak_rss_bytes"] > 300 * 2**20, big
    failed = run_measured([sys.executable, "-c", "import sys; sys.exit(3)"], 60)
    assert failed["exit"] == 3 and not failed["timed_out"]
    slow = run_measured([sys.executable, "-c", "import time; time.sleep(30)"], 0.5)
    assert slow["timed_out"] and slow["wall_s"] < 20


def test_render_marks_timeouts_and_failures():
    ok = {"wall_s": 2.0, "peak_rss_bytes": 2**30, "exit": 0, "timed_out": False}
    rows = [
        {"blocks": 1, "nodes": 1000, "commands": {"apply": ok, "estimate": {**ok, "exit": 2}}},
        {"blocks": 2, "nodes": 2000, "commands": {"apply": {**ok, "timed_out": True, "wall_s": 900.0}}},
    ]
    lines = render(rows).splitlines()
    assert lines[0] == "| nodes | `apply` | `estimate` | `apply`, µs per node |"
    assert lines[2] == "| 1,000 | 2.0 s, 1.00 GiB | exit 2 | 2000 |"
    assert lines[3] == "| 2,000 | > 900 s | - | - |"


def test_the_benchmark_runs_every_command_on_a_small_graph(tmp_path):
    out = tmp_path / "scale"
    assert main(["--blocks", "10", "--out", str(out), "--timeout", "300"]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    (row,) = data["rows"]
    assert row["nodes"] > 200
    for command in COMMANDS:
        r = row["commands"][command]
        assert not r["timed_out"] and r["exit"] == 0, (command, r)
    assert render(data["rows"]) in out.with_suffix(".md").read_text()
