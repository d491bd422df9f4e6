"""The emulation's fast paths give what the general code they stand for gives."""

from __future__ import annotations

import random

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.graph.toposort import already_sorted, index_order
from onnx_remat.ortsim.graph import _read_constant, element_count, node_attrs, runtime_graph


def _stable_kahn(reads: list[list[str]], writes: list[list[str]]) -> list[int]:
    """index_order by its definition, slowly: the earliest ready item first (the last writer of a
    name produces it, an item's own outputs do not feed it, an empty name is no tensor)."""
    producer = {o: i for i, outs in enumerate(writes) for o in outs if o}
    deps = [{producer[t] for t in ins if t in producer} - {i} for i, ins in enumerate(reads)]
    done: list[int] = []
    left = list(range(len(reads)))
    while True:
        ready = next((i for i in left if deps[i] <= set(done)), None)
        if ready is None:
            return done
        done.append(ready)
        left.remove(ready)


def test_index_order_and_its_sorted_fast_path_follow_the_definition():
    """Sorted lists, unsorted ones, names written twice, nodes reading their own outputs, empty names."""
    rng = random.Random(1)
    names = "abcdefgh"
    sorted_lists = 0
    for _ in range(3000):
        n = rng.randint(1, 7)
        inputs = [[rng.choice(names + "  ").strip() for _ in range(rng.randint(0, 3))] for _ in range(n)]
        outputs = [[rng.choice(names + " ").strip() for _ in range(rng.randint(0, 2))] for _ in range(n)]
        expected = _stable_kahn(inputs, outputs)
        assert index_order(inputs, outputs) == expected
        assert already_sorted(inputs, outputs) == (expected == list(range(n)))
        sorted_lists += expected == list(range(n))
    assert 300 < sorted_lists < 2700  # both paths taken often


class _Graph:
    def __init__(self, tensor: onnx.TensorProto) -> None:
        self.initializers = {tensor.name: tensor}


def _wrong_size() -> onnx.TensorProto:
    t = helper.make_tensor("x", onnx.TensorProto.INT64, [2], [1, 2])
    t.dims[0] = 3
    return t


@pytest.mark.parametrize(
    "tensor",
    [
        helper.make_tensor("x", onnx.TensorProto.INT64, [2], [3, -1]),
        helper.make_tensor("x", onnx.TensorProto.FLOAT, [], [0.1]),
        helper.make_tensor("x", onnx.TensorProto.FLOAT, [2, 2], [0.1, 2, 3, 4]),
        helper.make_tensor("x", onnx.TensorProto.INT32, [3], [1, 2, 3]),
        helper.make_tensor("x", onnx.TensorProto.DOUBLE, [1], [1e300]),
        helper.make_tensor("x", onnx.TensorProto.INT64, [0], []),
        helper.make_tensor("x", onnx.TensorProto.FLOAT16, [2], [1.5, 2]),
        numpy_helper.from_array(np.array([1.5, 2], dtype=np.float32), "x"),
        _wrong_size(),
    ],
)
def test_constants_read_as_numpy_helper_reads_them(tensor):
    fast = _read_constant(_Graph(tensor), "x")  # type: ignore[arg-type]
    try:
        slow = numpy_helper.to_array(tensor)
    except Exception:
        slow = None
    if slow is None:
        assert fast is None
        return
    assert fast is not None
    assert (fast.dtype, fast.shape, fast.tobytes()) == (slow.dtype, slow.shape, slow.tobytes())


@pytest.mark.parametrize("dims", [[], [0], [3, 4], [2**40, 2**40]])
def test_element_count_is_numpys(dims):
    assert element_count(dims) == int(np.prod(dims, dtype=np.int64))


def _random_graph(rng: random.Random, sort: bool) -> onnx.ModelProto:
    """Random nodes over a few names (some written twice, some read before written, optional
    inputs and outputs left empty), with attributes of several types."""
    names = "abcdefgh"
    nodes = []
    for k in range(rng.randint(1, 8)):
        ins = [rng.choice(names + "xx  ").strip() for _ in range(rng.randint(0, 3))]
        outs = [rng.choice(names + " ").strip() for _ in range(rng.randint(1, 2))]
        attrs = rng.choice(
            [
                {},
                {"axis": 1},
                {"alpha": 0.5, "perm": [1, 0]},
                {"mode": "x", "axes": [0], "value": helper.make_tensor("v", 1, [1], [1.0])},
            ]
        )
        nodes.append(helper.make_node(rng.choice(["Relu", "Add", "Shape"]), ins, outs, name=f"n{k}", **attrs))
    if sort:
        nodes = [nodes[i] for i in index_order([n.input for n in nodes], [n.output for n in nodes])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])], [])
    return helper.make_model(graph)


def test_loaded_graph_is_what_reindex_and_node_attrs_give():
    """runtime_graph builds the producer / consumer maps and each node's producers as it reads
    the nodes, and reads attributes when first asked: the same as the general code."""
    rng = random.Random(2)
    for trial in range(600):
        model = _random_graph(rng, sort=trial % 2 == 0)
        rg = runtime_graph(model, TensorSizes(model))
        loaded = (dict(rg.producer), {t: list(r) for t, r in rg.consumers.items()}, dict(rg._prods))
        for n in rg.live():
            assert n.attrs == node_attrs(model.graph.node[n.index])
            assert rg.producers_of(n) == [rg.producer[t] for t in n.inputs if t in rg.producer]
        rg.reindex()
        assert loaded[0] == rg.producer and loaded[1] == rg.consumers
        for n in rg.live():  # cached producers, where the load computed them, are the general ones
            if n.index in loaded[2]:
                assert loaded[2][n.index] == rg.producers_of(n)
