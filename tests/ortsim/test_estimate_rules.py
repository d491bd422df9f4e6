"""One small graph per rule of the memory emulation, each compared with onnxruntime's measured
planned peak (the memory-pattern block of one step; CPU, onnxruntime-training 1.19.2).

Each graph is built so that the rule changes the planned peak: without the rule the estimate is
off. Every test runs onnxruntime once (a worker process, about a second).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.estimate import estimate_graph

pytest.importorskip("onnxruntime")

X = [1, 64, 1024]  # 256 KiB of float


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _node(op, inputs, outputs, domain="", **attrs):
    return helper.make_node(op, inputs, outputs, name=outputs[0], domain=domain, **attrs)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(
        graph, ir_version=9, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    )


def _measured(model, tmp_path) -> int:
    from onnx_remat.runtime.measure import measure

    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return measure(path, steps=1, live=False).planned_peak_bytes


def _estimated(model, *, runtime_optimizations=True) -> int:
    est, _, _ = estimate_graph(model, TensorSizes(model), runtime_optimizations=runtime_optimizations)
    return est.planned_peak_bytes


def _check(model, tmp_path, expected):
    measured = _measured(model, tmp_path)
    estimated = _estimated(model)
    assert measured == expected, f"onnxruntime changed: measured {measured}, expected {expected}"
    assert estimated == measured, f"estimated {estimated}, measured {measured}"


def test_output_nothing_reads_takes_no_freed_buffer(tmp_path):
    # i (int64, 512 KiB) dies at step 1 and q takes its place in the block; j = Cast(q) is read by
    # nobody. Reusing i's buffer for j would cost nothing in the emulation (768 KiB), but
    # onnxruntime allocates j anew (microsoft/onnxruntime#21019): 1.25 MiB.
    nodes = [
        _node("Cast", ["x"], ["i"], to=TensorProto.INT64),
        _node("Cast", ["i"], ["i2"], to=TensorProto.FLOAT),
        _node("Add", ["x", "i2"], ["q"]),
        _node("Neg", ["q"], ["c0"]),
        _node("Add", ["c0", "i2"], ["c"]),
        _node("Cast", ["q"], ["j"], to=TensorProto.INT64),  # last in the list: runs right after q
    ]
    _check(_model(nodes, [_vi("x", X)], [_vi("c", X)]), tmp_path, 1310720)


def test_unread_maxpool_indices_are_not_shared(tmp_path):
    # Two MaxPools whose indices nobody reads (a recompute rewrite leaves the forward ones so):
    # each keeps a buffer of its own to the end of the step.
    def pool(x, outs):
        return _node("MaxPool", [x], outs, kernel_shape=[3], pads=[1, 1], strides=[1])

    nodes = [pool("x", ["a", "am"]), pool("y", ["b", "bm"]), _node("Add", ["a", "b"], ["c"])]
    _check(_model(nodes, [_vi("x", X), _vi("y", X)], [_vi("c", X)]), tmp_path, 1572864)


@pytest.mark.parametrize(
    "op,attrs,elem",
    [
        ("Softmax", {"axis": -1}, TensorProto.FLOAT),
        ("LogSoftmax", {"axis": -1}, TensorProto.FLOAT),
        ("Clip", {}, TensorProto.FLOAT),
        ("Cast", {"to": TensorProto.INT32}, TensorProto.INT32),  # same element size: in place
    ],
)
def test_kernels_that_work_in_place(tmp_path, op, attrs, elem):
    # a = Neg(x) is read last by `op`, whose output takes a's buffer: one 256 KiB buffer.
    nodes = [_node("Neg", ["x"], ["a"]), _node(op, ["a"], ["b"], **attrs)]
    nodes.append(_node("Cast", ["b"], ["c"], to=TensorProto.FLOAT) if op == "Cast" else _node("Neg", ["b"], ["c"]))
    _check(_model(nodes, [_vi("x", X)], [_vi("c", X)]), tmp_path, 262144)


def test_scale_output_is_planned(tmp_path):
    # com.microsoft::Scale (the ReduceMean gradient) keeps its input's shape: planned in the block.
    nodes = [
        _node("Neg", ["x"], ["a"]),
        _node("Scale", ["a", "s"], ["b"], domain="com.microsoft"),
        _node("Neg", ["b"], ["c"]),
    ]
    s = numpy_helper.from_array(np.array(2.0, np.float32), "s")
    _check(_model(nodes, [_vi("x", X)], [_vi("c", X)], [s]), tmp_path, 524288)


def test_size_runs_right_after_its_input(tmp_path):
    # The DEFAULT walk would run Size(a) after c0, keeping a alive through b and c0 (768 KiB); the
    # training build moves Shape / Size nodes right after their input's producer: a dies after b
    # and c0 takes its buffer (512 KiB, and 256 bytes that s and then sf use).
    nodes = [
        _node("Neg", ["x"], ["a"]),
        _node("Size", ["a"], ["s"]),
        _node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
        _node("Neg", ["a"], ["b"]),
        _node("Neg", ["b"], ["c0"]),
        _node("Mul", ["c0", "sf"], ["c"]),
    ]
    _check(_model(nodes, [_vi("x", X)], [_vi("c", X)]), tmp_path, 524288 + 256)


def test_equal_small_constants_are_shared(tmp_path):
    # Two Muls by equal 8-element constants of different names: onnxruntime's ConstantSharing
    # makes them one initializer, CSE then one node (a and m: 2 buffers instead of 3).
    shape = [8192, 8]  # 256 KiB of float
    v = np.arange(8, dtype=np.float32)
    inits = [numpy_helper.from_array(v, "s1"), numpy_helper.from_array(v.copy(), "s2")]
    nodes = [
        _node("Neg", ["x"], ["a"]),
        _node("Mul", ["a", "s1"], ["m1"]),
        _node("Mul", ["a", "s2"], ["m2"]),
        _node("Add", ["m1", "m2"], ["c"]),
    ]
    _check(_model(nodes, [_vi("x", shape)], [_vi("c", shape)], inits), tmp_path, 524288)


def test_nine_element_constants_are_not_shared(tmp_path):
    shape = [8192, 9]
    v = np.arange(9, dtype=np.float32)
    inits = [numpy_helper.from_array(v, "s1"), numpy_helper.from_array(v.copy(), "s2")]
    nodes = [
        _node("Neg", ["x"], ["a"]),
        _node("Mul", ["a", "s1"], ["m1"]),
        _node("Mul", ["a", "s2"], ["m2"]),
        _node("Add", ["m1", "m2"], ["c"]),
    ]
    _check(_model(nodes, [_vi("x", shape)], [_vi("c", shape)], inits), tmp_path, 3 * 294912)


def test_gemm_sum_fusion(tmp_path):
    # Sum(Gemm(a, w), d) becomes one Gemm with C = d (GemmSumFusion), appended to the node list:
    # the DEFAULT walk now runs the Gemm branch before the reduction branch (index 5), so s
    # (256 KiB) is alive next to t (1 MiB, placed above the freed a and d): 1.75 MiB.
    m = [256, 256]
    nodes = [
        _node("Neg", ["x"], ["a"]),
        _node("Neg", ["y"], ["d"]),
        _node("Gemm", ["a", "w"], ["g"]),
        _node("Sum", ["g", "d"], ["s"]),
        _node("Neg", ["z"], ["t"]),
        _node("ReduceMean", ["t"], ["e"], axes=[0], keepdims=1),
        _node("Add", ["s", "e"], ["c"]),
    ]
    model = _model(nodes, [_vi("x", m), _vi("y", m), _vi("w", m), _vi("z", [1024, 256])], [_vi("c", m)], opset=17)
    _check(model, tmp_path, 1835008)


def test_layer_norm_statistics_below_opset_17(tmp_path):
    # Below opset 17 LayerNormalization is onnxruntime's own op in the default domain; onnx knows
    # no shapes for it, onnxruntime does: its mean and inverse std-dev ([64, 1] each) are planned.
    nodes = [
        _node("LayerNormalization", ["x", "g", "b"], ["y", "mean", "inv"], axis=-1),
        _node("Mul", ["y", "mean"], ["y1"]),
        _node("Mul", ["y1", "inv"], ["c"]),
    ]
    inits = [
        numpy_helper.from_array(np.ones(1024, np.float32), "g"),
        numpy_helper.from_array(np.zeros(1024, np.float32), "b"),
    ]
    x = [64, 1024]
    _check(_model(nodes, [_vi("x", x)], [_vi("c", x)], inits, opset=14), tmp_path, 2 * 262144 + 2 * 256)


def _transpose(x, y):
    return _node("Transpose", [x], [y], perm=[0, 2, 1])


def test_transposes_pushed_through_elementwise_ops_cancel(tmp_path):
    # A normalization over a transposed sequence, twice (com.microsoft::Gelu stands in for the
    # op that needs the other layout: no Transpose is pushed through it). onnxruntime's
    # TransposeOptimizer pushes the second Transpose through Tanh, where it cancels the third:
    # two Transposes fewer, two buffers instead of three.
    nodes = [
        _transpose("x", "a"),
        _node("Gelu", ["a"], ["b"], domain="com.microsoft"),
        _transpose("b", "c"),
        _node("Tanh", ["c"], ["d"]),
        _transpose("d", "e"),
        _node("Gelu", ["e"], ["g"], domain="com.microsoft"),
        _transpose("g", "h"),
        _node("Tanh", ["h"], ["out"]),
    ]
    shape = [4, 64, 96]  # 96 KiB of float
    _check(_model(nodes, [_vi("x", shape)], [_vi("out", shape)]), tmp_path, 196608)


def test_transpose_pushed_through_broadcast_op(tmp_path):
    # Mul by a 1-D graph input: the pushed Transpose needs the input unsqueezed and transposed
    # (two new small nodes) and cancels the Transpose after the Mul.
    nodes = [
        _transpose("x", "a"),
        _node("Gelu", ["a"], ["b"], domain="com.microsoft"),
        _transpose("b", "c"),
        _node("Mul", ["c", "w"], ["d"]),
        _transpose("d", "e"),
        _node("Gelu", ["e"], ["out"], domain="com.microsoft"),
    ]
    _check(_model(nodes, [_vi("x", [4, 64, 96]), _vi("w", [96])], [_vi("out", [4, 96, 64])]), tmp_path, 197120)


def test_layer_norm_gradient_parameter_gradients_are_planned(tmp_path):
    # onnxruntime infers the shapes of LayerNormalizationGrad's scale and bias gradients (those of
    # the scale): they are planned in the block (4 KiB each here), below n1.
    inits = [
        numpy_helper.from_array(np.ones(1024, np.float32), "g"),
        numpy_helper.from_array(np.zeros(1024, np.float32), "b"),
    ]
    nodes = [
        _node("LayerNormalization", ["x", "g", "b"], ["y", "mean", "inv"], axis=-1),
        _node(
            "LayerNormalizationGrad",
            ["dy", "x", "g", "mean", "inv"],
            ["dx", "dg", "db"],
            domain="com.microsoft",
            axis=-1,
        ),
        _node("Neg", ["dx"], ["n1"]),
        _node("Add", ["n1", "y"], ["n2"]),
        _node("Add", ["dg", "db"], ["s"]),
        _node("Add", ["n2", "s"], ["c"]),
    ]
    x = [64, 1024]
    _check(_model(nodes, [_vi("x", x), _vi("dy", x)], [_vi("c", x)], inits), tmp_path, 799232)


def test_folded_shape_removes_the_chain_that_fed_it(tmp_path):
    # Shape(b) of a static b is folded; the nodes computing b (read by nothing else) go with it:
    # only the Sigmoid runs (one buffer, c0, plus the folded constant's small cast).
    nodes = [
        _node("Neg", ["x"], ["a"]),
        _node("Relu", ["a"], ["b"]),
        _node("Neg", ["b"], ["b2"]),
        _node("Shape", ["b2"], ["s"]),
        _node("ReduceSum", ["s"], ["r"], keepdims=0),
        _node("Cast", ["r"], ["sf"], to=TensorProto.FLOAT),
        _node("Sigmoid", ["x"], ["c0"]),
        _node("Mul", ["c0", "sf"], ["c"]),
    ]
    _check(_model(nodes, [_vi("x", X)], [_vi("c", X)]), tmp_path, 262144)


def test_concat_training_lengths_are_planned(tmp_path):
    # com.microsoft::ConcatTraining (onnxruntime's Concat with a second output: each input's length
    # along the axis, int64): onnxruntime knows both shapes; the lengths take 256 bytes of the block.
    nodes = [
        _node("Neg", ["x"], ["a"]),
        _node("Neg", ["y"], ["b"]),
        _node("ConcatTraining", ["a", "b"], ["z", "lengths"], domain="com.microsoft", axis=1),
        _node("Neg", ["z"], ["c"]),
    ]
    x = [64, 512]
    _check(_model(nodes, [_vi("x", x), _vi("y", x)], [_vi("c", [64, 1024])]), tmp_path, 524288 + 256)
