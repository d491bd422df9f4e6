"""The compiled DEFAULT order (onnx_remat/compiled/default_order.c) is order.py's Python walk, node for
node: on random graphs (repeated and unsorted producers, holes in the indices, Shape nodes moved,
several after one producer), on the example and corpus graphs as emulated, and after each pass of
the emulated optimizer."""

from __future__ import annotations

import random
from itertools import chain

import pytest
from conftest import artifacts_dir

from onnx_remat import compiled as native
from onnx_remat.analysis.model import analyze_model
from onnx_remat.ortsim.emulation import emulate
from onnx_remat.ortsim.graph import node_io, runtime_graph
from onnx_remat.ortsim.optimizer import LEVEL1, LEVEL2
from onnx_remat.ortsim.order import compiled_default_order, default_order


def _python(indices, producers, follow):
    has_consumer = set(chain.from_iterable(producers[i] for i in indices))
    return default_order(indices, producers, has_consumer, follow)


def test_the_install_builds_the_compiled_order():
    assert native.compiled(native.default_order_walk) is not None


@pytest.mark.parametrize("seed", range(40))
def test_random_graphs_order_the_same(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 300)
    # live indices with holes (removed nodes), producers among earlier live nodes, some repeated
    indices = sorted(rng.sample(range(n * 2), n))
    producers = {}
    for k, i in enumerate(indices):
        earlier = indices[:k]
        count = rng.choice([0, 1, 1, 1, 2, 3, 5]) if earlier else 0
        producers[i] = [rng.choice(earlier) for _ in range(count)]
    # Shape nodes after their input's producer: a node with one producer, several per producer
    follow = {i: ps[0] for i, ps in producers.items() if len(ps) == 1 and rng.random() < 0.15}
    compiled = compiled_default_order(indices, producers, follow)
    assert compiled == _python(indices, producers, follow)
    assert sorted(compiled) == indices


def test_an_empty_graph_orders_to_nothing():
    assert compiled_default_order([], {}, {}) == [] == _python([], {}, {})


@pytest.mark.parametrize("name", ["blocks10", "blocks10_dynamo", "gpt", "resnet", "fc5"])
def test_emulated_graphs_order_the_same_after_every_pass(name):
    analysis = analyze_model(artifacts_dir(name))
    g = emulate(analysis.model, analysis.sizes)
    rg = runtime_graph(g.model, g.sizes, io=node_io(g.model))
    for p in [*LEVEL1, *LEVEL2, *LEVEL1]:
        if p.applies(rg):
            p.apply(rg)
        indices = [n.index for n in rg.live()]
        producers = {i: rg.producers_of(rg.nodes[i]) for i in indices}
        follow = {i: ps[0] for i, ps in producers.items() if ps and rg.nodes[i].op in ("Shape", "Size")}
        assert compiled_default_order(indices, producers, follow) == _python(indices, producers, follow)


@pytest.mark.parametrize("name", ["gpt2_ts", "bert_dynamo", "llama_dynamo", "t5_ts", "resnet_ts"])
def test_corpus_graphs_emulate_the_same(corpus, monkeypatch, name):
    analysis = analyze_model(corpus(name))
    compiled = emulate(analysis.model, analysis.sizes.copy())
    monkeypatch.setenv("ONNX_REMAT_NATIVE", "0")
    python = emulate(analysis.model, analysis.sizes.copy())
    assert compiled.order == python.order
    assert compiled.planned_peak_bytes == python.planned_peak_bytes


@pytest.mark.parametrize("seed", range(10))
def test_leaves_in_another_list_order_order_the_same(seed):
    # scheduling.orders.LeafOrders hands the walk the node list with its leaves moved: the indices
    # are not ascending, and the leaves are pushed in the list's order
    rng = random.Random(1000 + seed)
    n = rng.randint(2, 200)
    indices = list(range(n))
    producers = {i: [rng.randrange(i) for _ in range(rng.choice([0, 1, 2]))] for i in range(1, n)}
    producers[0] = []
    readers = {p for ps in producers.values() for p in ps}
    leaves = [i for i in indices if i not in readers]
    rng.shuffle(leaves)
    listed = [i for i in indices if i in readers] + leaves
    assert compiled_default_order(listed, producers, {}) == _python(listed, producers, {})


def test_the_walk_refuses_what_is_not_a_graph():
    with pytest.raises(ValueError):
        compiled_default_order([0, 1, 1], {0: [], 1: [0]}, {})  # a node listed twice
    with pytest.raises(ValueError):
        compiled_default_order([0, 1], {0: [], 1: [5]}, {})  # a producer that is no node
