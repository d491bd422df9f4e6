"""benchmarks.native_speed: both ways planned, ordered and list-scheduled on one graph, agreeing, in a table."""

from __future__ import annotations

import json

from benchmarks.native_speed import main


def test_the_benchmark_times_both_ways_on_a_small_graph(tmp_path, capsys):
    out = tmp_path / "native_speed"
    main(["--blocks", "4", "--repeat", "1", "--out", str(out)])
    result = json.loads(out.with_suffix(".json").read_text())
    assert list(result["rows"]) == [
        "plan, cold",
        "plan, warm",
        "DEFAULT order",
        "list schedule, freeing",
        "list schedule, greedy",
    ]
    for by_way in result["rows"].values():
        assert set(by_way) == {"python", "compiled"} and all(t > 0 for t in by_way.values())
    table = out.with_suffix(".md").read_text()
    assert table == capsys.readouterr().out
    assert len([line for line in table.splitlines() if line.startswith(("| plan", "| DEFAULT", "| list"))]) == 5
