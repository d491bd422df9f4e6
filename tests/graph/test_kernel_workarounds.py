"""Grouped 1-D ConvGrad in the 2-D form (graph/kernel_workarounds.py): onnxruntime 1.19's CPU kernel
writes past the input gradient of a grouped convolution whose kernel is not 2-D; found on a
wav2vec 2.0 export, whose gradients below its positional convolution changed with the node order."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from onnx_remat.graph.kernel_workarounds import AXES_NAME, fix_grouped_conv_grads, grouped_conv_grads


def _conv_grad_model(group: int, kernel: list[int]) -> onnx.ModelProto:
    vi = helper.make_tensor_value_info
    rank = len(kernel)
    x_dims, w_dims, y_dims = [2, 8] + [20] * rank, [8, 8 // group] + kernel, [2, 8] + [20] * rank
    node = helper.make_node(
        "ConvGrad",
        ["dy", "x", "w"],
        ["dx", "dw", "db"],
        name="conv_grad",
        domain="com.microsoft",
        group=group,
        kernel_shape=kernel,
        pads=[k // 2 for k in kernel] * 2,
        strides=[1] * rank,
        dilations=[1] * rank,
    )
    graph = helper.make_graph(
        [node],
        "g",
        [vi("dy", TensorProto.FLOAT, y_dims), vi("x", TensorProto.FLOAT, x_dims), vi("w", TensorProto.FLOAT, w_dims)],
        [vi("dx", TensorProto.FLOAT, x_dims), vi("dw", TensorProto.FLOAT, w_dims), vi("db", TensorProto.FLOAT, [8])],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)], ir_version=8
    )


def test_only_grouped_kernels_that_are_not_2d_are_affected():
    assert [n.name for n in grouped_conv_grads(_conv_grad_model(4, [5]))] == ["conv_grad"]
    assert grouped_conv_grads(_conv_grad_model(1, [5])) == []  # one group: the kernel's sizes are right
    assert grouped_conv_grads(_conv_grad_model(4, [3, 3])) == []  # 2-D: another, correct code path
    model = _conv_grad_model(1, [5])
    assert fix_grouped_conv_grads(model) == (model, [])  # nothing to do: the same object


def test_a_grouped_1d_conv_grad_becomes_a_2d_one_between_views():
    model = _conv_grad_model(4, [5])
    fixed, names = fix_grouped_conv_grads(model)
    assert names == ["conv_grad"]
    ops = [(n.op_type, list(n.input), list(n.output)) for n in fixed.graph.node]
    assert [op for op, _, _ in ops] == ["Unsqueeze", "Unsqueeze", "Unsqueeze", "ConvGrad", "Squeeze", "Squeeze"]
    conv = next(n for n in fixed.graph.node if n.op_type == "ConvGrad")
    attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
    assert attrs["kernel_shape"] == [1, 5] and attrs["pads"] == [0, 2, 0, 2] and attrs["group"] == 4
    assert attrs["strides"] == [1, 1] and attrs["dilations"] == [1, 1]
    # the graph still produces dx, dw and db under their names; db needs no view
    assert {o for n in fixed.graph.node for o in n.output} >= {"dx", "dw", "db"}
    assert conv.output[2] == "db"
    assert any(t.name == AXES_NAME for t in fixed.graph.initializer)
    assert [n.op_type for n in model.graph.node] == ["ConvGrad"]  # the input is not changed
    made = {i.name for i in fixed.graph.input} | {t.name for t in fixed.graph.initializer}
    for n in fixed.graph.node:  # in topological order
        assert all(t in made for t in n.input if t), n.name
        made.update(n.output)
