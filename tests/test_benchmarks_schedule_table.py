"""benchmarks.schedule_table's Markdown rows (the measuring itself runs in `python -m benchmarks.schedule_table`)."""

from __future__ import annotations

from benchmarks.schedule_table import table

MiB = 2**20


def _row(**kw) -> dict:
    row = {
        "name": "m",
        "grad_accumulation": "inplace",
        "planned_original": 100 * MiB,
        "planned_scheduled": 100 * MiB,
        "planned_remat": 60 * MiB,
        "planned_remat_scheduled": 50 * MiB,
        "estimate_original": 100 * MiB,
        "estimate_scheduled": 100 * MiB,
        "estimate_remat": 63 * MiB,
        "estimate_remat_scheduled": 50 * MiB,
        "order": "unchanged",
        "accumulated": [],
        "step_time_scheduled_vs_original": 1.01,
        "step_time_remat_scheduled_vs_unscheduled": 0.98,
        "equal_scheduled": True,
        "equal_remat": True,
    }
    return {**row, **kw}


def test_rows_mark_unchanged_graphs_accumulation_and_the_largest_estimate_error():
    lines = table(
        [
            _row(),
            _row(
                grad_accumulation="early",
                planned_scheduled=64 * MiB,
                estimate_scheduled=64 * MiB,
                order="as written, early accumulation",
                accumulated=["wte"],
                equal_remat=False,
            ),
        ]
    ).splitlines()
    assert len(lines) == 4 and lines[0].count("|") == lines[2].count("|") == lines[3].count("|")
    assert "| m | inplace | 100.00 → 100.00 MiB (x1.00) | 60.00 → 50.00 MiB | x0.50 |" in lines[2]
    assert "x1.01 (same graph), x0.98 | 5.00% | yes | unchanged |" in lines[2]
    assert "| m | early (1 summed in place) | 100.00 → 64.00 MiB (x0.64) |" in lines[3]
    assert "x1.01, x0.98" in lines[3] and "| NO |" in lines[3]
