"""A module instance the forward pass runs more than once: one scope per call (onnx_remat.analysis.calls)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import artifacts_dir

import onnx_remat
from onnx_remat.analysis.model import analyze_model
from onnx_remat.analysis.scopes import Scope, _matches
from onnx_remat.runtime.compare import compare
from tests.regressions import CALLS, STEPS, Recurrent, SharedLayer, make_artifacts


@pytest.fixture(scope="module", params=["torchscript", "dynamo"])
def shared(request, tmp_path_factory):
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp(f"shared_{request.param}")
    return make_artifacts(
        SharedLayer(),
        torch.randn(8, 16),
        out / "model",
        exporter=request.param,
        opset=17 if request.param == "torchscript" else 18,
    )


def test_each_call_is_a_scope_of_its_own(shared):
    tree = analyze_model(shared).scopes
    calls = [s for s in tree.scopes() if s.module_path == "layer"]
    assert [s.path for s in calls] == [f"layer@{k}" for k in range(1, CALLS + 1)]
    # every call holds its own nodes, and the scopes below it are split with it
    assert len({id(n) for s in calls for n in s.all_nodes()}) == sum(len(s.all_nodes()) for s in calls)
    # (TorchScript names a repeated call's children and direct ops with a suffix: layer@2.up_1, and
    # a scope layer_1 of its own for the residual Add; the dynamo exporter does not)
    assert all(any(c.path.startswith(f"{s.path}.up") for c in s.children) for s in calls)
    # the calls after the first hold the same ops (the first may hold what every call reads of the
    # weights: a transpose made once)
    ops = [sorted(n.op for n in s.all_nodes()) for s in calls]
    assert ops[1] == ops[2]
    # TorchScript's own scope for a later call's direct ops (layer_1: the residual Add) joins that call
    assert not any(s.path.startswith("layer_") for s in tree.scopes())
    assert len({len(s.nodes) for s in calls}) == 1
    # the stem and the head, called once, are not split
    assert {"stem", "head"} <= {s.path for s in tree.scopes()}
    assert not any("@" in s.path for s in tree.scopes() if s.module_path in ("stem", "head"))
    # a node's scope is its call's
    assert all(
        tree.scope_of(n) is not None and tree.scope_of(n).path.startswith("layer@")
        for s in calls
        for n in s.all_nodes()
    )


def test_a_pattern_selects_every_call_or_one(shared):
    tree = analyze_model(shared).scopes
    assert [s.path for s in tree.match(["layer"]).scopes] == ["layer@1", "layer@2", "layer@3"]
    ups = [s.path for s in tree.match(["layer.up*"]).scopes]
    assert len(ups) == CALLS and ups[0] == "layer@1.up"
    assert [s.path for s in tree.match(["layer@2"]).scopes] == ["layer@2"]
    assert [s.path for s in tree.match(["layer@*"]).scopes] == ["layer@1", "layer@2", "layer@3"]


def test_each_call_is_recomputed_on_its_own_and_exactly(shared, tmp_path):
    result = onnx_remat.apply(shared, scopes="layer", check_peak=False)
    assert [s.label for s in result.rewrite.segments] == ["layer@1", "layer@2", "layer@3"]
    out = result.save(tmp_path / "remat")
    c = compare(shared, out, steps=1, warmup=1, live=False)
    assert c.equal, (c.mismatched[:5], c.equality_run)


@pytest.mark.parametrize(
    "pattern, path, hit",
    [
        ("layer", "layer@2", True),
        ("layer@2", "layer@2", True),
        ("layer@2", "layer@3", False),
        ("layer.*", "layer@2.up", True),
        ("layer@*.up", "layer@2.up", True),
        ("enc.layer", "enc.layer@10.up", False),
    ],
)
def test_calls_match_by_module_path(pattern, path, hit):
    assert _matches(pattern, Scope(path=path)) is hit


def test_module_path_drops_the_marks_of_calls():
    assert Scope(path="enc.layer@2.attn@1").module_path == "enc.layer.attn"
    assert Scope(path="blocks.0").module_path == "blocks.0"


def test_graphs_without_a_parameter_read_twice_keep_their_scopes():
    tree = analyze_model(artifacts_dir("blocks10")).scopes
    assert not any("@" in s.path for s in tree.scopes())


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_cell_run_per_time_step_is_a_call_per_step(exporter, tmp_path):
    """An LSTM cell run from a hidden state of zeros: the dynamo exporter folds the first step's
    hidden product into constants (the hidden weights are read one time fewer), TorchScript names
    the steps cell, cell_1, ...; either way each step is a call of its own, recomputed exactly."""
    torch.manual_seed(0)
    opset = 17 if exporter == "torchscript" else 18
    src = make_artifacts(
        Recurrent("lstm"), torch.randn(8, STEPS, 16), tmp_path / "lstm", exporter=exporter, opset=opset
    )
    tree = analyze_model(src).scopes
    assert [s.path for s in tree.match(["cell"]).scopes] == [f"cell@{k}" for k in range(1, STEPS + 1)]
    result = onnx_remat.apply(src, scopes="cell", check_peak=False)
    assert len(result.rewrite.segments) == STEPS
    c = compare(src, result.save(tmp_path / "remat"), steps=1, warmup=1, live=False)
    assert c.equal, (c.mismatched[:5], c.equality_run)


def test_calls_whose_order_is_unknown_are_not_split(tmp_path):
    """A GRU cell's input products are all made before the recurrence, in no order a path fixes:
    matched to calls by position they would give one call most of the nodes, so the scope stays whole."""
    torch.manual_seed(0)
    src = make_artifacts(Recurrent("gru"), torch.randn(8, STEPS, 16), tmp_path / "gru", exporter="dynamo", opset=18)
    tree = analyze_model(src).scopes
    assert [s.path for s in tree.match(["cell"]).scopes] == ["cell"]
