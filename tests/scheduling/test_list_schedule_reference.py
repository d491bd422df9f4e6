"""list_schedule keeps each node's delta up to date as readers run; it must pick exactly the nodes
the plain walk picks, which recomputes every delta from the inputs' reader counts when asked."""

from __future__ import annotations

import heapq
import random

import pytest
from conftest import artifacts_dir

from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.model_io import load_model
from onnx_remat.ortsim.emulation import emulate
from onnx_remat.ortsim.kernels import alias_input
from onnx_remat.ortsim.shapes import infer_runtime_shapes
from onnx_remat.scheduling.orders import POLICIES, list_schedule


def _plain_walk(rg, base, policy):
    """The list scheduler as first written: node indices, deltas summed again at every ask."""
    position = {i: k for k, i in enumerate(base)}
    nodes = [rg.at(i) for i in base]
    sizes = rg.sizes
    kept = set(rg.graph_inputs) | set(rg.initializers) | set(rg.graph_outputs)
    readers, inputs_of, in_degree, dependents, allocates = {}, {}, {}, {}, {}
    for n in nodes:
        ins = list(dict.fromkeys(t for t in n.inputs if t))
        inputs_of[n.index] = ins
        for t in ins:
            readers[t] = readers.get(t, 0) + 1
        producers = set(rg.producers_of(n))
        in_degree[n.index] = len(producers)
        for p in producers:
            dependents.setdefault(p, []).append(n.index)
        allocates[n.index] = sum(
            sizes.nbytes(o) or 0
            for k, o in enumerate(n.outputs)
            if o and alias_input(n.domain, n.op, k, len(n.inputs)) is None
        )

    def delta(i):
        freed = sum(sizes.nbytes(t) or 0 for t in inputs_of[i] if readers[t] == 1 and t not in kept)
        return allocates[i] - freed

    def key(i):
        if policy == "default":
            return (position[i],)
        if policy == "freeing":
            return (0 if delta(i) <= 0 else 1, position[i])
        return (delta(i), position[i])

    ready = [(key(i), i) for i in position if in_degree[i] == 0]
    heapq.heapify(ready)
    done, order = set(), []
    while ready:
        k, i = heapq.heappop(ready)
        if i in done:
            continue
        if key(i) != k:
            heapq.heappush(ready, (key(i), i))
            continue
        done.add(i)
        order.append(i)
        for t in inputs_of[i]:
            readers[t] -= 1
            if readers[t] == 1 and policy != "default":
                for c in rg.consumer_nodes(t):
                    if c not in done and in_degree.get(c) == 0:
                        heapq.heappush(ready, (key(c), c))
        for c in dependents.get(i, ()):
            in_degree[c] -= 1
            if in_degree[c] == 0:
                heapq.heappush(ready, (key(c), c))
    if len(order) != len(nodes):
        raise RuntimeError("the runtime graph has a cycle")
    return order


def _emulated(name):
    model = load_model(artifacts_dir(name)).model
    sizes = TensorSizes(model)
    infer_runtime_shapes(model, sizes)
    return emulate(model, sizes, shapes_known=True)


@pytest.mark.parametrize("name", ["gpt", "resnet"])
@pytest.mark.parametrize("policy", POLICIES)
def test_list_schedule_picks_what_the_plain_walk_picks(name, policy):
    g = _emulated(name)
    greedy = _plain_walk(g.rg, g.order, "greedy")  # another topological order
    shuffled = list(g.order)
    random.Random(0).shuffle(shuffled)  # not topological: the walk still orders it
    for base in (g.order, greedy, shuffled, list(reversed(g.order))):
        assert list_schedule(g.rg, base, policy) == _plain_walk(g.rg, base, policy)


def test_list_schedule_refuses_an_order_that_cannot_run_every_entry():
    g = _emulated("gpt")
    for base in (g.order[1:], [*g.order, g.order[0]]):  # a producer missing; a node twice
        for policy in POLICIES:
            with pytest.raises(RuntimeError, match="cycle"):
                list_schedule(g.rg, base, policy)
