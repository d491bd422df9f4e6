"""benchmarks/compare_pytorch.py and benchmarks/torch_step.py: the onnx-remat vs PyTorch benchmark.

Fast: the PyTorch step in this process (checkpointing keeps loss and gradients, and lowers the
peak), what onnx-remat keeps stored (fc5: five 2048x256 bool dropout masks), the verdict rules and
the Markdown writer. Slow: the whole benchmark on fc5 with one step (~40 s on 2 cores).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, artifacts_dir

MiB = 2**20


def test_checkpointing_keeps_loss_and_gradients():
    import torch

    from benchmarks.torch_step import wrap_blocks
    from models import MODELS

    spec = MODELS["fc5"]
    grads = []
    for ckpt in (False, True):
        module = spec.build()
        if ckpt:
            assert wrap_blocks(spec.blocks(module)) == 5
        torch.manual_seed(0)
        loss = spec.loss(module(*spec.example_inputs()), spec.example_target())
        loss.backward()
        grads.append([p.grad.clone() for p in module.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))  # RNG state preserved: same dropout masks


def test_torch_step_measures_a_lower_peak_with_checkpointing():
    from benchmarks.compare_pytorch import torch_worker
    from benchmarks.torch_step import run

    # fresh processes with the live-peak malloc settings, as the benchmark runs them
    eager = torch_worker("fc5", "live", False, steps=1, warmup=1, device="cpu")
    ckpt = torch_worker("fc5", "live", True, steps=1, warmup=1, device="cpu")
    assert eager["loss"] == ckpt["loss"]
    assert ckpt["block_input_bytes"] == 5 * 2048 * 256 * 4  # what checkpoint stores: each block's input
    if eager["live_peak_bytes"] is not None:  # /proc/self/clear_refs available
        assert ckpt["live_peak_bytes"] < eager["live_peak_bytes"]
    timed = run("fc5", kind="time", use_checkpoint=False, steps=2, warmup=1)
    assert len(timed["step_times"]) == 2 and timed["live_peak_bytes"] is None


def test_stored_for_recompute_counts_the_dropout_masks():
    import onnx_remat
    from benchmarks.compare_pytorch import stored_for_recompute

    result = onnx_remat.apply(artifacts_dir("fc5"), scopes="FCBlock")
    stored = stored_for_recompute(result)
    assert stored["dropout_masks"] == 5
    # bool masks, one per block, as stored: packed to bits but the one recomputed first (bytes)
    assert stored["dropout_mask_bytes"] == 4 * 2048 * 256 // 8 + 2048 * 256
    # the five block inputs (what PyTorch stores) and the last block's 2048x1 output
    assert stored["other_bytes"] == 5 * 2048 * 256 * 4 + 2048 * 4
    assert stored["unknown_sizes"] == 0

    # blocks10: ten 8x16x128x128 bool masks, nine packed to bits
    stored = stored_for_recompute(onnx_remat.apply(artifacts_dir("blocks10"), scopes="Block"))
    assert stored["dropout_masks"] == 10 and stored["dropout_mask_bytes"] == 9 * MiB // 4 + 2 * MiB
    byte = stored_for_recompute(onnx_remat.apply(artifacts_dir("blocks10"), scopes="Block", dropout="byte"))
    assert byte["dropout_masks"] == 10 and byte["dropout_mask_bytes"] == 9 * 2 * MiB + 2 * MiB
    assert stored["other_bytes"] == 10 * 2 * MiB  # x and the outputs of blocks 0-8: what PyTorch stores


def _row(config, runtime, live, ratio, time_ratio, planned=None):
    from benchmarks.compare_pytorch import Row

    return Row(
        runtime,
        config,
        config,
        planned_peak_bytes=planned,
        live_peak_bytes=live,
        peak_ratio=ratio,
        planned_peak_ratio=ratio if planned else None,
        time_ratio=time_ratio,
        step_time_s={"median": 0.5 * time_ratio},
    )


def test_verdict_names_the_masks_when_onnx_remat_falls_short():
    from benchmarks.compare_pytorch import verdict

    rows = {
        "baseline": _row("baseline", "onnxruntime", 200 * MiB, 1.0, 1.0, 200 * MiB),
        "remat": _row("remat", "onnxruntime", 70 * MiB, 0.35, 1.1, 70 * MiB),
        "eager": _row("eager", "pytorch", 300 * MiB, 1.0, 1.0),
        "checkpoint": _row("checkpoint", "pytorch", 60 * MiB, 0.2, 1.4),
    }
    stored = {"dropout_masks": 10, "dropout_mask_bytes": 20 * MiB, "other_bytes": 20 * MiB, "total_bytes": 40 * MiB}
    v = verdict(rows, stored, {"block_input_bytes": 20 * MiB})
    assert v["peak"] == "short" and v["time"] == "better"
    assert v["reason"] == "10 dropout masks kept for a bit-identical replay (20.0 MiB) cover the 10.0 MiB gap"
    assert "10 dropout masks (20.0 MiB)" in v["why"] and "PyTorch keeps 20.0 MiB of block inputs" in v["why"]

    # a gap the masks do not cover: the working set at the peak, from the simulated breakdown
    rows["remat"].live_peak_bytes = 100 * MiB
    breakdown = {
        "estimated_peak_bytes": 100 * MiB,
        "peak_node": "n",
        "stored_bytes": 40 * MiB,
        "stored_mask_bytes": 20 * MiB,
        "recompute_bytes": 30 * MiB,
        "backward_bytes": 30 * MiB,
        "held_bytes": 25 * MiB,
    }
    v = verdict(rows, stored, {"block_input_bytes": 20 * MiB}, breakdown)
    assert v["reason"].startswith(
        "larger working set at the peak (60.0 MiB vs at most 40.0 MiB in PyTorch; "
        "25.0 MiB of onnx-remat's peak are buffers held for reuse)"
    )


def test_verdict_when_only_the_baselines_differ():
    from benchmarks.compare_pytorch import verdict

    rows = {
        "baseline": _row("baseline", "onnxruntime", 34 * MiB, 1.0, 1.0, 34 * MiB),
        "remat": _row("remat", "onnxruntime", 18 * MiB, 18 / 34, 1.1, 18 * MiB),
        "eager": _row("eager", "pytorch", 42 * MiB, 1.0, 1.0),
        "checkpoint": _row("checkpoint", "pytorch", 18 * MiB, 18 / 42, 1.4),
    }
    v = verdict(rows, None, None)
    assert v["peak"] == "short" and "onnxruntime's own baseline is leaner" in v["reason"]


def test_markdown_has_both_ratios_side_by_side():
    from benchmarks.compare_pytorch import to_markdown, verdict

    rows = {
        "baseline": _row("baseline", "onnxruntime", 100 * MiB, 1.0, 1.0, 100 * MiB),
        "remat": _row("remat", "onnxruntime", 50 * MiB, 0.5, 1.1, 50 * MiB),
        "eager": _row("eager", "pytorch", 100 * MiB, 1.0, 1.0),
        "checkpoint": _row("checkpoint", "pytorch", 50 * MiB, 0.5, 1.3),
    }
    rows["remat"].gradients_identical = True
    report = {
        "date": "2025-01-01T00:00:00+00:00",
        "command": "python -m benchmarks.compare_pytorch",
        "steps": 1,
        "warmup": 1,
        "device": "cpu",
        "machine": {
            "cpu": "x",
            "cores": 2,
            "torch": "2",
            "onnxruntime": "1.19.2",
            "onnx_remat": "0.1.0",
            "git_head": "abc",
            "loadavg_start": [0.1],
            "loadavg_end": [0.2],
        },
        "models": [
            {
                "name": "m",
                "rows": [r.to_json() for r in rows.values()],
                "stored": {
                    "onnx_remat": {"dropout_masks": 0, "dropout_mask_bytes": 0, "other_bytes": 0, "total_bytes": 0},
                    "pytorch_checkpoint": {"block_input_bytes": 0},
                },
                "verdict": verdict(rows, None, None),
            }
        ],
    }
    md = to_markdown(report)
    summary = next(line for line in md.splitlines() if line.startswith("| m |"))
    assert "x0.50 [x0.50] | x1.10 | x0.50 | x1.30 | 50.0 MiB / 50.0 MiB | on par | better |" in summary
    assert "| m | onnxruntime | remat | 50.0 MiB | 50.0 MiB | x0.50 [x0.50] |" in md
    assert "| yes |" in md


@pytest.mark.slow
def test_benchmark_runs_end_to_end_on_fc5(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.compare_pytorch",
            "--models",
            "fc5",
            "--steps",
            "1",
            "--rounds",
            "1",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "cpu.json").read_text())
    assert report["machine"]["cores"] and report["machine"]["onnxruntime"] == "1.19.2"
    (model,) = report["models"]
    rows = {r["config"]: r for r in model["rows"]}
    assert set(rows) == {"baseline", "remat", "remat_outputs", "remat_seed", "eager", "checkpoint"}
    assert rows["remat_seed"]["gradients_identical"] is None and rows["remat_seed"]["seed_check"] is True
    assert not any(r["error"] for r in rows.values())
    assert rows["remat"]["gradients_identical"] is True and rows["remat_outputs"]["gradients_identical"] is True
    assert rows["remat"]["planned_peak_ratio"] < 0.6
    assert rows["checkpoint"]["peak_ratio"] < 0.6
    assert model["stored"]["onnx_remat"]["dropout_masks"] == 5
    assert len(rows["remat"]["step_time_s"]["round_medians"]) == 1
    assert (tmp_path / "cpu.md").read_text().startswith("# onnx-remat vs PyTorch checkpointing (cpu)")
