"""measure() and compare() end to end: real onnxruntime sessions in worker processes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from onnx_remat.errors import EnvironmentProblem, RematError
from onnx_remat.runtime.compare import compare
from onnx_remat.runtime.measure import measure

_spec = importlib.util.spec_from_file_location("runtime_models", Path(__file__).with_name("test_runtime_models.py"))
models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(models)

MiB = 2**20


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Artifacts of the 8192 x 256 embedding/MLP/dropout model (8 MiB activations)."""
    return models.tiny_artifacts(tmp_path_factory.getbasetemp(), "tiny")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """The same model with batch 64 (fast)."""
    return models.tiny_artifacts(tmp_path_factory.getbasetemp(), "small", batch=64)


@pytest.fixture(scope="module")
def blocks10():
    if not (models.BLOCKS10 / "training_model.onnx").exists():
        pytest.skip("models/artifacts/blocks10 not exported (python -m models.export blocks10)")
    return models.BLOCKS10


def test_measure_is_repeatable(tiny):
    runs = [measure(tiny, steps=3, warmup=1) for _ in range(3)]
    first = runs[0]
    assert first.planned_peak_bytes and first.planned_peak_bytes > 8 * MiB
    assert first.arena_peak_bytes >= first.planned_peak_bytes
    for m in runs[1:]:
        assert m.planned_peak_bytes == first.planned_peak_bytes
        assert m.arena_peak_bytes == first.arena_peak_bytes
        assert m.loss == first.loss
    lives = [m.live_peak_bytes for m in runs]
    assert all(lives)
    assert (max(lives) - min(lives)) / min(lives) < 0.01, lives
    # the live peak tracks the planned block (within the step's other buffers)
    assert 0.9 < first.live_peak_bytes / first.planned_peak_bytes < 1.5
    t = first.step_time_s
    assert len(t.samples) == 3 and t.min <= t.median <= t.max
    assert np.isfinite(first.loss)
    assert first.inputs["input_ids"].int_range == (0, 100)  # rows of the embedding table
    assert first.inputs["labels"].int_range == (0, 10)  # classes of the cross-entropy
    assert first.inputs["emb.weight"].source == "checkpoint"
    assert first.rewrite.clones_in_model == 0 and first.rewrite.segments == []
    data = first.to_json()
    for key in (
        "planned_peak_bytes",
        "arena_peak_bytes",
        "live_peak_bytes",
        "step_time_s",
        "loss",
        "device",
        "model",
        "steps",
        "rewrite",
    ):
        assert key in data
    assert set(data["step_time_s"]) >= {"median", "min", "max"}


def test_blocks10_planned_peak_is_215_mib(blocks10):
    m = measure(blocks10, steps=1, warmup=1, live=False)
    assert m.planned_peak_bytes == 215 * MiB
    assert m.live_peak_bytes is None


def _naive_dropout_rewrite(path) -> onnx.ModelProto:
    """A deliberately wrong rewrite: each Dropout recomputed as a Dropout, which draws a new mask
    (the correct rewrite replays the stored mask)."""
    import onnx_remat
    from onnx_remat.remat.rewrite import RecomputeRewrite

    analysis = onnx_remat.analyze_model(path)
    plan = onnx_remat.plan(analysis, op_types=["Dropout"])
    return RecomputeRewrite(replay_dropout=False)(analysis.graph, plan).model


def test_compare_identical_pair(tiny):
    c = compare(tiny, tiny, steps=1, warmup=1, live=False)
    assert c.equal and not c.mismatched
    # GatherGrad (the embedding's gradient) sums rows in a varying order with 2 threads: the
    # graph disagrees with itself, so equality was checked on one-thread steps
    assert "emb.weight_grad" in c.a.unstable_outputs
    assert c.equality_run == "single_thread"
    assert list(c.max_abs_diff) == c.a.output_names  # the loss first, then the gradients
    assert set(c.a.output_names[1:]) == {f"{p}_grad" for p in models.PARAMS}
    assert all(v == 0.0 for v in c.max_abs_diff.values())
    assert c.ratios["planned_peak_bytes"] == 1.0


def test_compare_correct_rewrite_equal_and_smaller(blocks10):
    import onnx_remat

    rewritten = onnx_remat.apply(blocks10, scopes=["Block"]).model  # in memory: checkpoint given
    c = compare(blocks10, rewritten, checkpoint=blocks10 / "checkpoint", steps=1, warmup=1, live=False)
    assert c.equal, c.mismatched
    assert len(c.max_abs_diff) == 11 and all(v == 0.0 for v in c.max_abs_diff.values())
    assert c.a.planned_peak_bytes == 215 * MiB
    assert c.b.planned_peak_bytes < 0.5 * c.a.planned_peak_bytes
    assert c.ratios["planned_peak_bytes"] == c.b.planned_peak_bytes / c.a.planned_peak_bytes
    rw = c.b.rewrite
    assert rw.clones_in_model == 100 and rw.barriers_in_model == rw.barriers_kept == 10
    assert len(rw.segments) == 10
    assert all(s.ran_after_trigger and s.ran_after_forward for s in rw.segments)
    assert all(0 < s.clones_kept == s.clones_ran for s in rw.segments)


def test_compare_catches_wrong_rewrite(blocks10):
    c = compare(
        blocks10, _naive_dropout_rewrite(blocks10), checkpoint=blocks10 / "checkpoint", steps=1, warmup=1, live=False
    )
    assert not c.equal
    assert c.max_abs_diff["onnx::reducemean_output::6"] == 0.0  # the forward pass is the same
    assert "blocks.0.y_grad" in c.mismatched and c.max_abs_diff["blocks.0.y_grad"] > 0
    assert "blocks.9.y_grad" not in c.mismatched  # nothing upstream of the last block's clone


def test_compare_within_tolerance(small, tmp_path):
    # B is A with the second Linear's weights scaled by 1 + 1e-6: not bit-identical, but close
    model = onnx.load(str(small / "training_model.onnx"))
    scale = onnx.numpy_helper.from_array(np.array(1 + 2**-20, np.float32), "tiny_scale")
    model.graph.initializer.append(scale)
    for node in model.graph.node:
        if node.name == "/head/MatMul":
            node.input[1] = "fc2.scaled"
            model.graph.node.insert(
                0, helper.make_node("Mul", ["fc2.weight", "tiny_scale"], ["fc2.scaled"], name="scale")
            )
            break
    c = compare(small, model, steps=1, warmup=1, live=False)
    assert not c.equal and c.mismatched
    c = compare(small, model, steps=1, warmup=1, live=False, rtol=1e-4, atol=1e-6)
    assert c.equal


def test_non_finite_loss_is_an_error(tmp_path):
    with pytest.raises(RematError, match="loss is not finite"):
        measure(models.nan_loss_model(tmp_path / "nan.onnx"), steps=1, live=False)


def test_checkpoint_lacking_parameters(tmp_path_factory):
    lacking = models.checkpoint_lacking(tmp_path_factory.getbasetemp())
    with pytest.raises(RematError) as err:
        measure(lacking, steps=1, live=False)
    assert "lacks 1 of the graph's 5 parameters: head.scale" in str(err.value)


def test_synthesized_parameters_without_checkpoint(tiny, tmp_path):
    bare = tmp_path / "bare.onnx"
    bare.write_bytes((tiny / "training_model.onnx").read_bytes())
    m = measure(bare, steps=1, live=False)
    assert m.checkpoint is None and "no checkpoint: parameters synthesized" in m.notes
    assert m.inputs["fc1.weight"].source == "synthesized"
    assert np.isfinite(m.loss)


def test_cuda_needs_cuda_build_or_gpu(tiny):
    with pytest.raises(EnvironmentProblem) as err:
        measure(tiny, device="cuda")
    assert err.value.exit_code == 3


def _spec(model_dir: Path, workdir: Path, device: str) -> dict:
    from onnx_remat.runtime.inputs import prepare_feeds

    feeds = prepare_feeds(onnx.load(str(model_dir / "training_model.onnx")))
    return {
        "kind": "arena",
        "model": str(model_dir / "training_model.onnx"),
        "device": device,
        "feeds": str(feeds.save(workdir / "feeds.npz")),
        "checkpoint": str(model_dir / "checkpoint"),
        "from_checkpoint": feeds.from_checkpoint,
        "buffers": feeds.buffers,
        "flags": feeds.flags,
        "warmup": 1,
        "steps": 1,
        "seed": 0,
        "workdir": str(workdir / "run"),
    }


def test_worker_on_cpu_build_asked_for_cuda_is_exit_3(small, tmp_path):
    from onnx_remat.runtime.measure import run_worker, worker_env

    with pytest.raises(EnvironmentProblem) as err:
        run_worker(_spec(small, tmp_path, "cuda"), env=worker_env("cpu"))
    assert "CUDA" in str(err.value) and "\n" not in str(err.value)


def test_worker_dying_without_driver_is_exit_3(small, tmp_path, monkeypatch):
    # What the CUDA build does on a machine without a driver: it aborts from a constructor.
    import onnx_remat.runtime.measure as measure_module

    fake = tmp_path / "fake_worker.sh"
    fake.write_text(
        "#!/bin/sh\necho \"terminate called after throwing an instance of 'onnxruntime::OnnxRuntimeException'\" >&2\n"
        "echo '  what():  cudaDriverWrapper.cc:42 CUDADriverWrapper::CUDADriverWrapper() "
        "handle != nullptr was false.' >&2\n"
        "kill -ABRT $$\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(measure_module, "worker_command", lambda: [str(fake)])
    with pytest.raises(EnvironmentProblem, match="no NVIDIA driver or GPU is usable"):
        measure_module.run_worker(_spec(small, tmp_path, "cuda"))
    with pytest.raises(RematError, match="measuring process died"):  # on CPU it is just a crash
        measure_module.run_worker(_spec(small, tmp_path, "cpu"))
