"""Per-node costs: onnxruntime's profile mapped back to the training graph, or a FLOP estimate."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import artifacts_dir

from onnx_remat.analysis.model import analyze_model
from onnx_remat.remat.cost import (
    cache_path,
    estimate_costs,
    exported_name,
    kernel_times,
    node_costs,
    read_profile,
)


@pytest.fixture(scope="module")
def blocks10():
    return analyze_model(artifacts_dir("blocks10"))


def _event(name, ts, dur, cat="Node"):
    return {"cat": cat, "name": name, "ts": ts, "dur": dur}


def test_kernel_times_average_runs_after_the_first():
    events = [
        _event("model_run", 0, 100, "Session"),
        _event("a_kernel_time", 10, 90),  # first run: warm-up, left out
        _event("model_run", 200, 100, "Session"),
        _event("a_kernel_time", 210, 30),
        _event("b_kernel_time", 250, 10),
        _event("model_run", 400, 100, "Session"),
        _event("a_kernel_time", 410, 10),
        _event("b_kernel_time", 450, 10),
    ]
    times, runs = kernel_times(events)
    assert runs == 2
    assert times == pytest.approx({"a": 20e-6, "b": 10e-6})


def test_fused_kernels_map_to_the_node_they_were_made_from():
    assert exported_name("/blocks.0/MatMul/MatMulScaleFusion/") == "/blocks.0/MatMul"
    assert exported_name("/blocks.0/MatMul/MatMulScaleFusion//MatmulTransposeFusion/") == "/blocks.0/MatMul"
    assert exported_name("Gelu_token_3") == "Gelu"


def test_profile_costs_map_by_name_and_fused_nodes_cost_nothing(blocks10):
    costs = node_costs(
        blocks10, {"kernels": {"/blocks.0/MatMul/MatMulScaleFusion/": 0.002, "/blocks.0/Softmax": 0.001}}
    )
    assert costs.source == "profile"
    assert costs.seconds["/blocks.0/MatMul"] == 0.002 and costs.seconds["/blocks.0/Softmax"] == 0.001
    assert costs.seconds["/blocks.0/Div"] == 0  # folded into the MatMul's kernel
    assert costs.total == pytest.approx(0.003)


def test_flop_estimate_orders_nodes_sensibly(blocks10):
    costs = estimate_costs(blocks10.graph.order, blocks10.sizes)
    by = costs.seconds
    assert by["/blocks.0/MatMul"] > by["/blocks.0/Unsqueeze"]
    assert by["/blocks.0/drop/Dropout"] > by["/blocks.0/Softmax"]  # the random draw
    dropout = next(n for n in blocks10.graph.order if n.name == "/blocks.0/drop/Dropout")
    assert costs.recompute_of(dropout) < costs.of(dropout)  # replayed from its mask, not drawn again


def test_read_profile_rejects_other_json(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"hello": 1}))
    from onnx_remat.errors import RematError

    with pytest.raises(RematError, match="neither"):
        read_profile(bad)


def test_measured_profile_is_cached_beside_the_model(tmp_path):
    from onnx_remat.runtime.profile import profile_costs

    art = shutil.copytree(artifacts_dir("fc5"), tmp_path / "fc5")
    data = profile_costs(art, steps=1)
    cached = cache_path(art / "training_model.onnx")
    assert cached.is_file() and data["kernels"]
    again = profile_costs(art)  # from the cache: no run
    assert again == json.loads(cached.read_text())
    costs = node_costs(analyze_model(art))  # the cached profile is found by default
    assert costs.source == "profile" and costs.total > 0
