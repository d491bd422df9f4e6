"""The compiled memory-plan walk (onnx_remat/compiled/plan_walk.c, numbered by plan_arrays.py) plans
every order exactly as the Python planner does, field for field and in the same tensor order: on
the example graphs, corpus graphs of both exporters, recompute rewrites and every list scheduler's
order; and it hands back to the Python planner what it does not plan (part of a graph, a node run
twice, a tensor planned twice)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from conftest import artifacts_dir

import onnx_remat
from onnx_remat.analysis.model import analyze_model
from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.ortsim import plan_arrays, planner
from onnx_remat.ortsim.emulation import emulate
from onnx_remat.ortsim.planner import plan_memory, prepare_plans, python_plan
from onnx_remat.scheduling.orders import POLICIES, list_schedule


def _same(made, reference) -> None:
    assert dataclasses.asdict(made) == dataclasses.asdict(reference)
    assert list(made.tensors) == list(reference.tensors)  # listed in the same order too


def _orders(g):
    return [g.order] + [list_schedule(g.rg, g.order, policy) for policy in POLICIES]


def _compiled(rg, order):
    """The plan of ``order`` by the compiled walk, checked to be the walk's (not the fallback)."""
    arrays = planner.numbered(rg)
    nodes = [n for n in (rg.nodes[i] for i in order) if n is not None]
    assert plan_arrays.walk(arrays, nodes) is not None
    return plan_memory(rg, order)


def test_the_install_builds_the_compiled_walk():
    # make setup builds it (a C compiler and Python's headers); without it every plan is made in
    # Python, correct but ~5x slower on large graphs
    assert plan_arrays.native_available()


@pytest.mark.parametrize("name", ["blocks10", "blocks10_dynamo", "gpt", "resnet", "fc5"])
def test_example_graphs_plan_the_same(name):
    analysis = analyze_model(artifacts_dir(name))
    g = emulate(analysis.model, analysis.sizes)
    for order in _orders(g):
        _same(_compiled(g.rg, order), python_plan(g.rg, order))


@pytest.mark.parametrize("name", ["gpt2_ts", "bert_dynamo", "llama_dynamo", "t5_ts", "resnet_ts", "swin_ts"])
def test_corpus_graphs_plan_the_same(corpus, name):
    analysis = analyze_model(corpus(name))
    g = emulate(analysis.model, analysis.sizes)
    for order in _orders(g):
        _same(_compiled(g.rg, order), python_plan(g.rg, order))


@pytest.mark.parametrize(
    "name, selection",
    [
        ("gpt", {"scopes": ["Block"]}),
        ("resnet", {"scopes": ["BasicBlock"]}),
        ("blocks10", {"recompute_outputs": True, "scopes": ["Block"]}),
    ],
)
def test_rewrites_plan_the_same(name, selection):
    # a recompute rewrite: clones, barriers, packed dropout masks, pins
    result = onnx_remat.apply(artifacts_dir(name), schedule=False, check_peak=False, **selection)
    model = result.model
    g = emulate(model, TensorSizes(model))
    for order in _orders(g):
        _same(_compiled(g.rg, order), python_plan(g.rg, order))


def test_the_synthetic_graph_plans_the_same(synthetic_dir):
    analysis = analyze_model(synthetic_dir)
    g = emulate(analysis.model, analysis.sizes)
    prepare_plans(g.rg)  # numbered before the plans, as the memory schedule does before its fork
    arrays = g.rg.plan_arrays
    for order in _orders(g):
        _same(_compiled(g.rg, order), python_plan(g.rg, order))
        assert g.rg.plan_arrays is arrays  # numbered once for the graph, not per plan


def test_the_numbering_follows_the_graph():
    analysis = analyze_model(artifacts_dir("blocks10"))
    g = emulate(analysis.model, analysis.sizes)
    plan_memory(g.rg, g.order)
    first = g.rg.plan_arrays
    g.rg.edits += 1  # any edit: numbered again
    plan_memory(g.rg, g.order)
    assert g.rg.plan_arrays is not first and g.rg.plan_arrays.state == planner._graph_state(g.rg)


def test_what_the_walk_does_not_plan_is_planned_in_python():
    analysis = analyze_model(artifacts_dir("blocks10"))
    g = emulate(analysis.model, analysis.sizes)
    arrays = planner.numbered(g.rg)
    nodes = [g.rg.nodes[i] for i in g.order]
    # part of the graph: planned as the graph of those nodes alone
    part = g.order[: len(g.order) // 2]
    assert plan_arrays.walk(arrays, nodes[: len(part)]) is None
    _same(plan_memory(g.rg, part), python_plan(g.rg, part))
    # a node run twice (and another not at all)
    twice = g.order[:-1] + [g.order[0]]
    assert plan_arrays.walk(arrays, [g.rg.nodes[i] for i in twice]) is None
    _same(plan_memory(g.rg, twice), python_plan(g.rg, twice))


def test_a_tensor_planned_twice_is_planned_in_python():
    analysis = analyze_model(artifacts_dir("blocks10"))
    g = emulate(analysis.model, analysis.sizes)
    rg = copy.copy(g.rg)
    rg.nodes = list(g.rg.nodes)
    # the last node writes the first node's output again (a graph onnxruntime would reject)
    first, last = rg.nodes[g.order[0]], rg.nodes[g.order[-1]]
    rg.nodes[last.index] = dataclasses.replace(last, outputs=[first.outputs[0], *last.outputs[1:]])
    rg.plan_arrays = rg.plan_tables = None
    assert plan_arrays.walk(planner.numbered(rg), [rg.nodes[i] for i in g.order]) is None
    _same(plan_memory(rg, g.order), python_plan(rg, g.order))


def test_the_switch_turns_the_walk_off(monkeypatch):
    monkeypatch.setenv("ONNX_REMAT_NATIVE", "0")
    assert not plan_arrays.native_available()
    analysis = analyze_model(artifacts_dir("gpt"))
    g = emulate(analysis.model, analysis.sizes)
    plan_memory(g.rg, g.order)
    assert g.rg.plan_arrays is None and g.rg.plan_tables is not None
