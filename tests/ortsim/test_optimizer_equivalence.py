"""The emulation's fast paths give what the general code they stand for gives."""

from __future__ import annotations

import random

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnx_remat.graph.toposort import index_order
from onnx_remat.ortsim.graph import _read_constant, element_count
from onnx_remat.ortsim.shapes import _topological_order


def test_topological_order_is_index_order():
    """Sorted lists, unsorted ones, names written twice, nodes reading their own outputs."""
    rng = random.Random(1)
    names = "abcdefgh"
    for _ in range(2000):
        n = rng.randint(1, 7)
        inputs = [[rng.choice(names + "  ").strip() for _ in range(rng.randint(0, 3))] for _ in range(n)]
        outputs = [[rng.choice(names) for _ in range(rng.randint(0, 2))] for _ in range(n)]
        assert list(_topological_order(inputs, outputs)) == index_order(inputs, outputs)


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
