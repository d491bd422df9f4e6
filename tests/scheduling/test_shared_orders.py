"""The per-graph schedulers MemorySchedule uses give what the one-shot functions give: ListScheduler
what list_schedule gives for each policy, LeafOrders (which walks the graph's own node indices)
what the walk over a renumbered node list gives, for any ranking of the leaves."""

from __future__ import annotations

import random

import pytest
from conftest import artifacts_dir
from onnx import TensorProto, helper

from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.model_io import load_model
from onnx_remat.ortsim.emulation import emulate
from onnx_remat.ortsim.graph import runtime_graph
from onnx_remat.ortsim.shapes import infer_runtime_shapes
from onnx_remat.scheduling.orders import POLICIES, LeafOrders, ListScheduler, leaf_ranked_order, list_schedule


def _emulation(name):
    model = load_model(artifacts_dir(name)).model
    sizes = TensorSizes(model)
    infer_runtime_shapes(model, sizes)
    return emulate(model, sizes, shapes_known=True)


def _rankings(ends: list[int], seed: int) -> list[dict[int, int]]:
    rnd = random.Random(seed)
    shuffled = list(ends)
    rnd.shuffle(shuffled)
    return [
        {},
        {i: k for k, i in enumerate(ends)},
        {i: k for k, i in enumerate(shuffled) if rnd.random() < 0.7},  # some leaves unranked
        {i: rnd.randrange(3) for i in ends},  # ties
    ]


@pytest.mark.parametrize("name", ["blocks10", "gpt", "resnet"])
def test_list_scheduler_gives_list_schedule(name):
    g = _emulation(name)
    for base in (g.order, list_schedule(g.rg, g.order, "greedy")):
        scheduler = ListScheduler(g.rg, base)
        for policy in (*POLICIES, *POLICIES):  # again: a walk must not change what the next one reads
            assert scheduler.order(policy) == list_schedule(g.rg, base, policy)


@pytest.mark.parametrize("name", ["blocks10", "gpt", "resnet"])
def test_leaf_orders_walk_the_renumbered_list(name):
    g = _emulation(name)
    orders = LeafOrders(g.rg, g.first_added)
    assert not orders.leaf_follows
    scheduler = ListScheduler(g.rg, g.order)
    ranks = [{i: k for k, i in enumerate(scheduler.order(p)) if i in set(orders.leaves)} for p in POLICIES]
    for rank in ranks + _rankings(orders.leaves, 0):
        assert orders.order(rank) == orders._renumbered(rank) == leaf_ranked_order(g.rg, g.first_added, rank)


def test_a_shape_leaf_takes_the_renumbered_walk():
    # x -> Relu -> a; Shape(a) and Size(a) are leaves that follow Relu, as is Neg(a)
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Shape", ["a"], ["s"], name="shape"),
        helper.make_node("Neg", ["a"], ["n"], name="neg"),
        helper.make_node("Size", ["a"], ["z"], name="size"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in ("n",)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rg = runtime_graph(model, TensorSizes(model))
    orders = LeafOrders(rg, len(nodes))
    assert orders.leaf_follows
    leaves = orders.leaves
    for rank in [{}, {i: k for k, i in enumerate(leaves)}, {i: -k for k, i in enumerate(leaves)}]:
        assert orders.order(rank) == orders._renumbered(rank)
        assert sorted(orders.order(rank)) == sorted(n.index for n in rg.live())
