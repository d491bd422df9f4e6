"""benchmarks.stage_times: one command run with its pipeline stages traced, in a table and JSON."""

from __future__ import annotations

import json

from conftest import artifacts_dir

from benchmarks.stage_times import main


def test_the_stages_of_one_apply_are_traced_in_order(tmp_path, capsys):
    out, report = tmp_path / "blocks10_remat", tmp_path / "stages.json"
    status = main(
        ["--json", str(report), "--", "apply", str(artifacts_dir("blocks10")), "--scope", "Block", "-o", str(out), "-q"]
    )
    assert status == 0 and (out / "training_model.onnx").is_file()
    result = json.loads(report.read_text())
    assert result["status"] == 0 and result["command"][0] == "apply"
    calls = result["calls"]
    stages = [c["stage"] for c in calls]
    # the pipeline's stages, each once and in the order they run
    top = ["analyze_model", "Planner.plan", "order_rewrite", "ApplyResult.save"]
    assert all(stages.count(s) == 1 for s in top)
    assert [s for s in stages if s in top] == top
    for c in calls:
        assert 0 <= c["start"] <= c["end"] <= result["seconds"]
    by_stage = {c["stage"]: c for c in calls}
    order, emulated = by_stage["order_rewrite"], by_stage["emulate_rewrite"]
    assert order["start"] <= emulated["start"] <= emulated["end"] <= order["end"]  # nested, as the table shows
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("| command") or line.startswith("| child")]
    assert len(rows) == len(calls)
    assert "`analyze_model`" in rows[0] and "&nbsp;&nbsp;`emulate_rewrite`" in table


def test_a_failing_command_gives_its_status(tmp_path, capsys):
    status = main(["--", "apply", str(artifacts_dir("blocks10")), "--scope", "NoSuchScope", "-o", str(tmp_path / "o")])
    assert status == 1
    assert "error:" in capsys.readouterr().err


def test_the_stages_are_put_back_after_the_run(tmp_path):
    import onnx_remat.analysis.model as model
    import onnx_remat.scheduling.schedule as schedule

    before = (model.analyze_model, schedule.MemorySchedule.__dict__["__call__"], schedule.order_rewrite)
    main(["--", "apply", str(artifacts_dir("blocks10")), "--scope", "Block", "-o", str(tmp_path / "o"), "-q"])
    assert (model.analyze_model, schedule.MemorySchedule.__dict__["__call__"], schedule.order_rewrite) == before
