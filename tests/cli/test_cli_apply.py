"""``onnx-remat apply`` and ``onnx-remat scopes`` through the real console script."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import artifacts_dir, assert_one_line_error


def _listing(path):
    return sorted(p.name for p in path.iterdir())


def test_apply_artifacts_directory(cli, tmp_path):
    out = tmp_path / "blocks10_remat"
    proc = cli("apply", artifacts_dir("blocks10"), "--scope", "Block", "-o", out, "--json", tmp_path / "s.json")
    assert proc.returncode == 0, proc.stderr
    assert "blocks.9" in proc.stdout and "100 nodes cloned in 10 segments" in proc.stdout
    # 190 MiB of activations, and 9 of the 10 dropout masks less their bits (dropout="packed")
    assert "205.8 MiB of stored activations released" in proc.stdout
    assert "dropout masks (packed): 10 masks stored in 4.2 MiB: 9 at one bit per element, 1 at one byte" in proc.stdout
    assert _listing(out) == ["checkpoint", "eval_model.onnx", "optimizer_model.onnx", "training_model.onnx"]
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["cloned_nodes"] == 100 and summary["released_bytes"] == 190 * 2**20 + 9 * 7 * 2**18
    assert summary["dropout"] == "packed" and summary["mask_bytes"] == 9 * 2**18 + 2 * 2**20
    assert [s["label"] for s in summary["segments"]] == [f"blocks.{i}" for i in range(10)]


_MODULE_STEP = r"""
import sys, numpy as np, onnxruntime as ort
from onnxruntime.training.api import Module, CheckpointState
d = sys.argv[1]
state = CheckpointState.load_checkpoint(d + "/checkpoint")
m = Module(d + "/training_model.onnx", state, d + "/eval_model.onnx", device="cpu")
m.train()
rng = np.random.default_rng(0)
x = rng.standard_normal((8, 128, 16, 32), dtype=np.float32)
t = rng.standard_normal((8, 128, 16, 32), dtype=np.float32)
ort.set_seed(7)
loss = m(x, t)
grads = np.concatenate([state.parameters[f"blocks.{i}.y"].grad.ravel() for i in range(10)])
np.save(sys.argv[2], np.concatenate([np.atleast_1d(loss), grads]))
"""


def test_module_trains_the_rewritten_artifacts_identically(cli, tmp_path):
    """onnxruntime-training's own Module loads the output; loss and gradients are bit-identical."""
    out = tmp_path / "remat"
    assert cli("apply", artifacts_dir("blocks10"), "--scope", "Block", "-o", out, "-q").returncode == 0
    results = []
    for name, d in (("before", artifacts_dir("blocks10")), ("after", out)):
        target = tmp_path / f"{name}.npy"
        proc = subprocess.run([sys.executable, "-c", _MODULE_STEP, str(d), str(target)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        import numpy as np

        results.append(np.load(target))
    assert results[0].tobytes() == results[1].tobytes()


def test_apply_model_file_with_op_types(cli, tmp_path):
    src = tmp_path / "model.onnx"
    src.write_bytes((artifacts_dir("gpt") / "training_model.onnx").read_bytes())
    proc = cli("apply", src, "--op-type", "Softmax,Gelu", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "model.remat.onnx").exists()  # the default output: in the current directory
    assert "wrote" in proc.stdout


def test_scopes_command(cli, tmp_path):
    proc = cli("scopes", artifacts_dir("blocks10"), "--depth", "0", "--json", tmp_path / "s.json")
    assert proc.returncode == 0, proc.stderr
    assert "repeated: blocks.0 .. blocks.9 (10 x Block) -> try --scope Block" in proc.stdout
    data = json.loads((tmp_path / "s.json").read_text())
    rows = {r["path"]: r for r in data["scopes"]}
    assert rows["blocks.3"]["stashed_bytes"] == 24 * 2**20
    assert rows["blocks.3"]["releasable_bytes"] == 20 * 2**20 + 7 * 2**18  # and the mask, packed to bits
    assert rows["blocks.3"]["class"] == "models.blocks10.Block"


# -- bad input: one line, exit 1, no traceback, nothing written --------------------------------


def test_not_onnx(cli, tmp_path):
    bad = tmp_path / "notes.onnx"
    bad.write_text("this is not a model\n")
    assert_one_line_error(cli("apply", bad, "--scope", "Block"), "not an ONNX model")
    assert _listing(tmp_path) == ["notes.onnx"]


def test_truncated(cli, tmp_path):
    data = (artifacts_dir("blocks10") / "training_model.onnx").read_bytes()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[:20000])
    proc = cli("apply", cut, "--scope", "Block")
    assert_one_line_error(proc, "cut.onnx")
    assert _listing(tmp_path) == ["cut.onnx"]


def test_forward_only_graph(cli, tmp_path):
    proc = cli("apply", artifacts_dir("blocks10") / "eval_model.onnx", "--scope", "Block", "-o", tmp_path / "x.onnx")
    assert_one_line_error(proc, "forward-only graph", "give the training graph beside it", "training_model.onnx")
    assert _listing(tmp_path) == []


def test_scope_matching_nothing_names_the_closest(cli, tmp_path):
    proc = cli("apply", artifacts_dir("blocks10"), "--scope", "blocks.11", "-o", tmp_path / "x")
    assert_one_line_error(proc, "'blocks.11' matches no scope; closest: blocks.1")
    assert _listing(tmp_path) == []


def test_output_equal_to_input_is_refused_even_with_force(cli, tmp_path):
    src = tmp_path / "model.onnx"
    data = (artifacts_dir("fc5") / "training_model.onnx").read_bytes()
    src.write_bytes(data)
    for force in ((), ("--force",)):
        proc = cli("apply", src, "--scope", "runfunc*", "-o", src, *force)
        assert_one_line_error(proc, "this is the model", code=2)
    assert src.read_bytes() == data and _listing(tmp_path) == ["model.onnx"]


def test_missing_model_and_usage_errors(cli, tmp_path):
    assert_one_line_error(cli("apply", tmp_path / "nope.onnx", "--scope", "x"), "no such file")
    assert_one_line_error(cli("apply", artifacts_dir("blocks10"), "-o", tmp_path / "x"), "nothing selected")
    assert_one_line_error(cli("scopes", artifacts_dir("blocks10"), "--dim", "batch"), "--dim takes name=value", code=2)


def test_apply_measure_prints_the_before_after_table(cli, tmp_path):
    proc = cli(
        "apply",
        artifacts_dir("fc5"),
        "--scope",
        "FCBlock",
        "-o",
        tmp_path / "out",
        "--measure",
        "--json",
        tmp_path / "s.json",
    )
    assert proc.returncode == 0, proc.stderr
    assert "planned peak" in proc.stdout and "PASSED" in proc.stdout
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["measure"]["equal"] is True
    assert data["measure"]["ratios"]["planned_peak_bytes"] < 0.7


def test_apply_prints_at_most_30_segments(cli, tmp_path):
    """A per-layer rewrite of a deep model prints 30 segment rows and how many more; --json has all."""
    from benchmarks.synthetic import training_artifacts

    model = training_artifacts(40, tmp_path / "deep", batch=2, seq=8, width=16)
    proc = cli("apply", model, "--scope", "blocks.*", "-o", tmp_path / "out", "--json", tmp_path / "s.json")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split()[0] for line in proc.stdout.splitlines() if line.strip().startswith("blocks.")]
    assert rows == [f"blocks.{i}" for i in range(30)], proc.stdout
    assert "... 10 more segments (all of them in --json)" in proc.stdout
    assert "40 segments" in proc.stdout
    summary = json.loads((tmp_path / "s.json").read_text())
    assert [s["label"] for s in summary["segments"]] == [f"blocks.{i}" for i in range(40)]
