"""The measure and compare commands through the real CLI: output, JSON fields, and one-line errors."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from onnx_remat.cli.main import main

_spec = importlib.util.spec_from_file_location(
    "runtime_models", Path(__file__).parents[1] / "runtime" / "test_runtime_models.py"
)
models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(models)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Artifacts of the embedding/MLP model with batch 64 (fast)."""
    return models.tiny_artifacts(tmp_path_factory.getbasetemp(), "small", batch=64)


def _cli(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result


def _one_line_error(result, code=1, *fragments):
    assert result.exit_code == code, (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    # progress lines ("[12:00:01] ... starting onnxruntime") may come first: stdout is not a terminal
    err = "\n".join(line for line in result.stderr.strip().splitlines() if not re.match(r"\[\d\d:\d\d:\d\d\] ", line))
    assert err.startswith("error: ") and "\n" not in err, err
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


def test_measure_prints_table_and_json(small, tmp_path):
    out = tmp_path / "m.json"
    result = _cli("measure", small, "--steps", "2", "--json", out)
    assert result.exit_code == 0, result.output
    for word in ("planned peak", "arena peak", "live peak", "step time", "KiB", "input_ids", "[0, 100)"):
        assert word in result.stdout, word
    data = json.loads(out.read_text())
    for key in (
        "planned_peak_bytes",
        "arena_peak_bytes",
        "live_peak_bytes",
        "loss",
        "device",
        "model",
        "steps",
        "rewrite",
        "inputs",
    ):
        assert key in data, key
    assert set(data["step_time_s"]) >= {"median", "min", "max"}
    assert data["device"] == "cpu" and data["steps"] == 2
    assert isinstance(data["planned_peak_bytes"], int)


def test_measure_json_to_stdout_through_console_script(small, cli):
    result = cli("measure", small, "--steps", "1", "--no-live", "--json", "-")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["live_peak_bytes"] is None and data["planned_peak_bytes"] > 0


def test_compare_passes_and_fails(small, tmp_path):
    result = _cli("compare", small, small, "--steps", "1", "--no-live", "--json", tmp_path / "c.json")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1].startswith("PASSED")
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["equal"] is True and set(data) >= {"a", "b", "ratios", "max_abs_diff"}
    assert set(data["ratios"]) == {"planned_peak_bytes", "arena_peak_bytes", "live_peak_bytes", "step_time_s"}

    # B: the same graph with a changed constant (the dropout ratio): loss and gradients differ
    model = onnx.load(str(small / "training_model.onnx"))
    for init in model.graph.initializer:
        if init.name == "ratio":
            init.CopyFrom(onnx.numpy_helper.from_array(np.array(0.2, np.float32), "ratio"))
    onnx.save(model, str(tmp_path / "other.onnx"))
    result = _cli("compare", small, tmp_path / "other.onnx", "--steps", "1", "--no-live")
    assert result.exit_code == 1, result.output
    assert result.stdout.strip().splitlines()[-1].startswith("FAILED")
    assert "Traceback" not in result.output


def _symbolic_model(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["loss"], keepdims=0)],
        "sym",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def test_missing_dims(tmp_path):
    model = _symbolic_model(tmp_path / "sym.onnx")
    _one_line_error(_cli("measure", model), 1, "batch", "seq", "--dim batch=", "--dim seq=")
    result = _cli("measure", model, "--dim", "batch=2", "--dim", "seq=3", "--steps", "1", "--no-live")
    assert result.exit_code == 0, result.output


def test_bad_inputs_file(small, tmp_path):
    good = {"input_ids": np.zeros(64, np.int64), "labels": np.zeros(64, np.int64)}
    np.savez(tmp_path / "names.npz", input_idz=good["input_ids"], labels=good["labels"])
    _one_line_error(
        _cli("measure", small, "--inputs", tmp_path / "names.npz"), 1, "'input_idz'", "did you mean 'input_ids'"
    )
    np.savez(tmp_path / "shape.npz", input_ids=np.zeros(32, np.int64), labels=good["labels"])
    _one_line_error(
        _cli("measure", small, "--inputs", tmp_path / "shape.npz"),
        1,
        "'input_ids' has shape (32,), the graph wants (64)",
    )
    np.savez(tmp_path / "dtype.npz", input_ids=good["input_ids"].astype(np.int32), labels=good["labels"])
    _one_line_error(_cli("measure", small, "--inputs", tmp_path / "dtype.npz"), 1, "int32", "int64")
    _one_line_error(_cli("measure", small, "--inputs", tmp_path / "absent.npz"), 1, "no such file")


def test_bad_int_range(small):
    _one_line_error(_cli("measure", small, "--int-range", "tokens=0:5"), 1, "tokens", "input_ids, labels")
    _one_line_error(_cli("measure", small, "--int-range", "input_ids=5:1"), 2, "low must be below high")
    _one_line_error(_cli("measure", small, "--int-range", "input_ids=a:b"), 2, "name=low:high")


def test_checkpoint_lacking_parameter(tmp_path_factory):
    lacking = models.checkpoint_lacking(tmp_path_factory.getbasetemp())
    _one_line_error(_cli("measure", lacking, "--steps", "1", "--no-live"), 1, "head.scale", "checkpoint lacks")


def test_non_finite_loss(tmp_path):
    _one_line_error(
        _cli("measure", models.nan_loss_model(tmp_path / "nan.onnx"), "--steps", "1"), 1, "loss is not finite"
    )


def test_bad_model_files(tmp_path):
    _one_line_error(_cli("measure", tmp_path / "absent.onnx"), 1, "no such file")
    (tmp_path / "junk.onnx").write_text("not a model")
    _one_line_error(_cli("measure", tmp_path / "junk.onnx"), 1, "junk.onnx")


def test_cuda_is_exit_3_here(small):
    _one_line_error(_cli("measure", small, "--device", "cuda"), 3, "cuda")
    _one_line_error(_cli("compare", small, small, "--device", "cuda"), 3, "cuda")
