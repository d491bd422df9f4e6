"""onnxruntime's load check in a child process (onnx_remat.runtime.load_check.PendingLoadCheck): the
command analyses the graph while onnxruntime loads it, and the verdict is the same as in-process."""

from __future__ import annotations

import shutil
import stat

import onnx
import pytest
from conftest import artifacts_dir

from onnx_remat.analysis.model import analyze_model, runtime_judged
from onnx_remat.errors import RematError
from onnx_remat.model_io import load_model
from onnx_remat.runtime import load_check
from onnx_remat.runtime.load_check import PendingLoadCheck, onnxruntime_load_error


@pytest.fixture
def refused(tmp_path):
    """fc5's artifacts with an accumulation buffer retyped: only onnxruntime's load refuses it
    (the mutation fuzzer found it; ONNX's inference skips onnxruntime's own ops)."""
    art = tmp_path / "fc5"
    shutil.copytree(artifacts_dir("fc5"), art)
    path = art / "training_model.onnx"
    model = onnx.load(str(path))
    readers = {i for n in model.graph.node if n.op_type == "InPlaceAccumulatorV2" for i in n.input}
    next(v for v in model.graph.input if v.name in readers).type.tensor_type.elem_type = onnx.TensorProto.INT8
    onnx.save(model, str(path))
    return path


def test_the_child_gives_the_same_verdict_as_in_process(refused):
    in_process = onnxruntime_load_error(refused)
    assert in_process is not None
    assert PendingLoadCheck(refused).refusal() == in_process
    assert PendingLoadCheck(artifacts_dir("fc5") / "training_model.onnx").refusal() is None


def test_a_deferred_check_is_settled_before_anything_returns(refused, monkeypatch):
    monkeypatch.setattr(load_check, "CHILD_MIN_NODES", 0)  # the child, whatever this process imported
    loaded = load_model(refused, defer_load_check=True)
    assert isinstance(loaded.load_check, PendingLoadCheck)
    with pytest.raises(RematError, match="onnxruntime refuses to load it"):
        loaded.settle_load_check()
    loaded.settle_load_check()  # settled: the second call does nothing
    # analyze_model settles it itself unless told to defer
    with pytest.raises(RematError, match="onnxruntime refuses to load it"):
        analyze_model(refused)
    analysis = analyze_model(refused, defer_load_check=True)
    with pytest.raises(RematError, match="onnxruntime refuses to load it"), runtime_judged(analysis):
        pass


def test_an_error_met_meanwhile_gives_way_to_the_refusal(refused, monkeypatch):
    """Whatever a command meets while onnxruntime still judges the graph (here a stand-in for an
    internal error on a graph it refuses), the user is told onnxruntime's refusal."""
    monkeypatch.setattr(load_check, "CHILD_MIN_NODES", 0)
    analysis = analyze_model(refused, defer_load_check=True)
    with pytest.raises(RematError, match="onnxruntime refuses to load it"), runtime_judged(analysis):
        raise ValueError("met on the way")
    # a graph onnxruntime loads: the block's own error comes through
    good = analyze_model(artifacts_dir("fc5"), defer_load_check=True)
    with pytest.raises(ValueError, match="met on the way"), runtime_judged(good):
        raise ValueError("met on the way")


def test_a_child_that_dies_is_a_refusal(tmp_path, monkeypatch):
    """onnxruntime crashing on a file (the mutation fuzzer saw a segfault) would crash training
    too: the command refuses the model in one line instead of dying."""
    crash = tmp_path / "python"
    crash.write_text("#!/bin/sh\nkill -SEGV $$\n")
    crash.chmod(crash.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(load_check.sys, "executable", str(crash))
    assert PendingLoadCheck(artifacts_dir("fc5") / "training_model.onnx").refusal() == (
        "onnxruntime crashed loading it (signal 11)"
    )
