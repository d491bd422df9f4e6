"""The compiled list scheduler (onnx_remat/compiled/list_schedule.c, on the memory planner's
numbering of the graph) walks every policy's order exactly as ListScheduler's Python walk does: on
the example graphs, corpus graphs of both exporters, recompute rewrites, the synthetic graph, from
another base order, and on random graphs (sizes unknown or zero, graph inputs, initializers and
outputs read, aliasing kernels); it declines a tensor written twice (the Python walk orders that)
and raises on a cycle as the Python walk does."""

from __future__ import annotations

import random

import numpy as np
import onnx
import pytest
from conftest import artifacts_dir
from onnx import TensorProto, helper

import onnx_remat
from onnx_remat import compiled as native
from onnx_remat.analysis.model import analyze_model
from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.ortsim.emulation import Emulation, emulate
from onnx_remat.ortsim.graph import runtime_graph
from onnx_remat.ortsim.planner import numbered
from onnx_remat.scheduling.orders import POLICIES, ListScheduler


def _python_order(rg, base, policy, monkeypatch) -> list[int]:
    with monkeypatch.context() as m:
        m.setenv("ONNX_REMAT_NATIVE", "0")
        return ListScheduler(rg, base).order(policy)


def _compiled_order(rg, base, policy) -> list[int]:
    """The compiled walk's order, checked to be the walk's (not the Python fallback)."""
    scheduler = ListScheduler(rg, base)
    walked = scheduler._compiled_order(policy)
    assert walked is not None
    assert scheduler.order(policy) == walked
    return walked


def _same_orders(g: Emulation, monkeypatch) -> None:
    for base in (g.order, _python_order(g.rg, g.order, "greedy", monkeypatch)):
        for policy in POLICIES:
            assert _compiled_order(g.rg, base, policy) == _python_order(g.rg, base, policy, monkeypatch), policy


def test_the_install_builds_the_compiled_scheduler():
    assert native.compiled(native.list_schedule_walk) is not None


@pytest.mark.parametrize("name", ["blocks10", "blocks10_dynamo", "gpt", "resnet", "fc5"])
def test_example_graphs_order_the_same(name, monkeypatch):
    analysis = analyze_model(artifacts_dir(name))
    _same_orders(emulate(analysis.model, analysis.sizes), monkeypatch)


@pytest.mark.parametrize("name", ["gpt2_ts", "bert_dynamo", "llama_dynamo", "t5_ts", "vit_dynamo", "wav2vec2_ts"])
def test_corpus_graphs_order_the_same(corpus, name, monkeypatch):
    analysis = analyze_model(corpus(name))
    _same_orders(emulate(analysis.model, analysis.sizes), monkeypatch)


@pytest.mark.parametrize(
    "name, selection",
    [("gpt", {"scopes": ["Block"]}), ("blocks10", {"recompute_outputs": True, "scopes": ["Block"]})],
)
def test_rewrites_order_the_same(name, selection, monkeypatch):
    # clones, barriers, packed dropout masks (PassThrough aliases their input), pins
    model = onnx_remat.apply(artifacts_dir(name), schedule=False, check_peak=False, **selection).model
    _same_orders(emulate(model, TensorSizes(model)), monkeypatch)


def test_the_synthetic_graph_orders_the_same(synthetic_dir, monkeypatch):
    analysis = analyze_model(synthetic_dir)
    g = emulate(analysis.model, analysis.sizes)
    arrays = numbered(g.rg)
    _same_orders(g, monkeypatch)
    assert g.rg.plan_arrays is arrays  # the plans' numbering, not one of its own


def _random_model(rng: random.Random) -> onnx.ModelProto:
    """A random DAG of Add / Relu / Reshape (which aliases its input) / Split nodes over two graph
    inputs and an initializer; some tensors of unknown shape, some of zero elements, several graph
    outputs (one of them read by other nodes too)."""
    shapes = [[rng.choice([0, 1, 2, 3, 8, 16]), rng.choice([1, 4, 16])] for _ in range(3)]
    names = ["x", "y", "w"]
    known = {n: s for n, s in zip(names, shapes)}
    nodes = []
    for k in range(rng.randint(3, 60)):
        op = rng.choice(["Add", "Add", "Relu", "Reshape", "Split"])
        a = rng.choice(names)
        out = f"t{k}"
        if op == "Add":
            b = rng.choice([n for n in names if known.get(n) == known.get(a)] or [a])
            nodes.append(helper.make_node("Add", [a, b], [out], name=f"n{k}"))
            known[out] = known.get(a)  # type: ignore[assignment]
        elif op == "Relu":
            nodes.append(helper.make_node("Relu", [a], [out], name=f"n{k}"))
            known[out] = known.get(a)  # type: ignore[assignment]
        elif op == "Reshape":
            nodes.append(helper.make_node("Reshape", [a, "flat"], [out], name=f"n{k}"))
            known[out] = None  # type: ignore[assignment]
        else:
            outs = [out, f"{out}_b"]
            nodes.append(helper.make_node("Split", [a], outs, name=f"n{k}", axis=0, num_outputs=2))
            for o in outs:
                known[o] = None  # type: ignore[assignment]
                names.append(o)
            continue
        names.append(out)
    read = {t for n in nodes for t in n.input}
    outputs = [t for t in names[3:] if t not in read] + rng.sample(names[3:], min(2, len(names) - 3))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in zip(["x", "y"], shapes)],
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in dict.fromkeys(outputs)],
        [
            helper.make_tensor("w", TensorProto.FLOAT, shapes[2], np.zeros(shapes[2], np.float32).ravel().tolist()),
            helper.make_tensor("flat", TensorProto.INT64, [1], [-1]),
        ],
        value_info=[
            helper.make_tensor_value_info(t, TensorProto.FLOAT, s) for t, s in known.items() if t[0] == "t" and s
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("seed", range(30))
def test_random_graphs_order_the_same(seed, monkeypatch):
    rng = random.Random(seed)
    model = _random_model(rng)
    rg = runtime_graph(model, TensorSizes(model))
    base = [n.index for n in rg.live()]
    for order in (base, _python_order(rg, base, "greedy", monkeypatch)):
        for policy in POLICIES:
            assert _compiled_order(rg, order, policy) == _python_order(rg, order, policy, monkeypatch), policy


def _tiny_graph():
    model = helper.make_model(
        helper.make_graph(
            [
                helper.make_node("Relu", ["x"], ["a"], name="r0"),
                helper.make_node("Relu", ["a"], ["b"], name="r1"),
                helper.make_node("Relu", ["b"], ["c"], name="r2"),
            ],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
            [helper.make_tensor_value_info("c", TensorProto.FLOAT, [4])],
        ),
        opset_imports=[helper.make_opsetid("", 18)],
    )
    return runtime_graph(model, TensorSizes(model))


def test_a_tensor_written_twice_is_ordered_in_python(monkeypatch):
    import dataclasses

    rg = _tiny_graph()
    last = rg.nodes[2]
    assert last is not None
    rg.nodes[2] = dataclasses.replace(last, outputs=["a"])  # writes r0's output again
    rg.plan_arrays = None
    base = [0, 1, 2]
    assert ListScheduler(rg, base)._compiled_order("freeing") is None
    assert ListScheduler(rg, base).order("freeing") == _python_order(rg, base, "freeing", monkeypatch)


def test_a_producer_outside_the_order_is_a_cycle(monkeypatch):
    rg = _tiny_graph()
    for policy in POLICIES:
        with pytest.raises(RuntimeError, match="cycle"):
            ListScheduler(rg, [0, 2]).order(policy)  # r2 reads r1, which never runs
        with pytest.raises(RuntimeError, match="cycle"):
            _python_order(rg, [0, 2], policy, monkeypatch)


def test_the_switch_turns_the_scheduler_off(monkeypatch):
    monkeypatch.setenv("ONNX_REMAT_NATIVE", "0")
    rg = _tiny_graph()
    scheduler = ListScheduler(rg, [0, 1, 2])
    assert scheduler._compiled_order("greedy") is None
    assert scheduler.order("greedy") == [0, 1, 2]
    assert rg.plan_arrays is None  # not numbered for a walk that is off
