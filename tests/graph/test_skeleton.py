"""The data-free skeleton that ONNX's checker and shape inference get (onnx_remat.graph.skeleton)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import artifacts_dir
from onnx import TensorProto, helper, numpy_helper

from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.errors import RematError
from onnx_remat.graph.skeleton import INFERENCE_DATA_BYTES, skeleton_bytes, skeleton_header
from onnx_remat.ortsim.registry import check_runtime_support


def _model() -> onnx.ModelProto:
    """x (2, 64) @ W (64, 512) -> Reshape to a shape held by a small initializer -> Relu."""
    weight = numpy_helper.from_array(np.arange(64 * 512, dtype=np.float32).reshape(64, 512), "W")
    shape = numpy_helper.from_array(np.array([4, -1], dtype=np.int64), "shape")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm", doc_string="kept"),
        helper.make_node("Reshape", ["h", "shape"], ["r"], name="reshape"),
        helper.make_node("Relu", ["r"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[weight, shape],
        value_info=[helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 512])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_header_drops_large_data_and_keeps_small():
    model = _model()
    before = model.SerializeToString()
    header = skeleton_header(model, keep_data_upto=INFERENCE_DATA_BYTES)
    assert model.SerializeToString() == before  # the input is not changed
    assert len(header.graph.node) == 0
    assert [i.name for i in header.graph.initializer] == ["shape"]  # 16 bytes: kept with its data
    weight_input = next(i for i in header.graph.input if i.name == "W")  # 128 KiB: a typed input
    assert weight_input.type.tensor_type.elem_type == TensorProto.FLOAT
    assert [d.dim_value for d in weight_input.type.tensor_type.shape.dim] == [64, 512]
    assert [v.name for v in header.graph.value_info] == ["h"]
    assert not skeleton_header(model).graph.initializer  # default: no data at all


def test_bytes_parse_as_the_header_with_the_nodes():
    model = _model()
    header = skeleton_header(model)
    parsed = onnx.ModelProto.FromString(skeleton_bytes(header, model.graph))
    expected = onnx.ModelProto()
    expected.CopyFrom(header)
    expected.graph.node.extend(model.graph.node)
    assert parsed == expected
    assert parsed.graph.node[0].doc_string == "kept"


def test_edit_replaces_only_the_nodes_it_returns():
    model = _model()

    def rename(node: onnx.NodeProto) -> onnx.NodeProto | None:
        if node.op_type != "Relu":
            return None
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = "edited"
        return copy

    parsed = onnx.ModelProto.FromString(skeleton_bytes(skeleton_header(model), model.graph, rename))
    assert [n.name for n in parsed.graph.node] == ["mm", "reshape", "edited"]
    assert [n.name for n in model.graph.node] == ["mm", "reshape", "relu"]


def test_sizes_infer_through_small_initializer_values_without_the_weights():
    # The Reshape's output shape needs the values of "shape" (kept); the MatMul only W's type and dims.
    sizes = TensorSizes(_model())
    assert sizes.inference_error is None
    assert sizes.shape("h") == (2, 512)
    assert sizes.shape("r") == (4, 256)
    assert sizes.shape("y") == (4, 256)
    assert sizes.nbytes("W") == 64 * 512 * 4  # initializers are still read from the model itself


def test_checker_still_sees_nodes_and_moved_runtime_ops_inside_subgraphs():
    # An onnxruntime-only op (LayerNormalization before opset 17) inside an If branch: moved out of
    # the checker's way on a copy of the node, while the ONNX op beside it is still checked.
    def branch(name: str, softmax_axis) -> onnx.GraphProto:
        return helper.make_graph(
            [
                helper.make_node("LayerNormalization", ["x", "scale", "bias"], [f"{name}_t"], axis=-1),
                helper.make_node("Softmax", [f"{name}_t"], [f"{name}_out"], axis=softmax_axis),
            ],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [2, 4])],
        )

    def model(softmax_axis) -> onnx.ModelProto:
        graph = helper.make_graph(
            [
                helper.make_node(
                    "If", ["cond"], ["y"], then_branch=branch("a", softmax_axis), else_branch=branch("b", -1)
                )
            ],
            "g",
            [
                helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
            initializer=[
                helper.make_tensor("scale", TensorProto.FLOAT, [4], [1.0] * 4),
                helper.make_tensor("bias", TensorProto.FLOAT, [4], [0.0] * 4),
            ],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)

    good = model(-1)
    with pytest.raises(onnx.checker.ValidationError, match="LayerNormalization"):
        onnx.checker.check_model(good)  # what the move spares onnxruntime's own op
    before = good.SerializeToString()
    check_runtime_support(good)
    assert good.SerializeToString() == before  # the domains were moved on a copy
    with pytest.raises(RematError, match="invalid ONNX model"):
        check_runtime_support(model("wrong"))


def test_sizes_take_the_load_checks_inference():
    """The load check's strict inference (on a skeleton keeping the small initializers' data) gives
    the same sizes as TensorSizes' own inference, so the analysis takes it rather than inferring the
    graph twice; a model whose inference the check flags gets none, and TensorSizes infers."""
    from onnx_remat.model_io import load_model

    for name in ("blocks10", "blocks10_dynamo", "gpt", "fc5", "resnet"):
        model = onnx.load(str(artifacts_dir(name) / "training_model.onnx"), load_external_data=False)
        typed = check_runtime_support(model, name, shapes=True)
        assert typed is not None
        own, taken = TensorSizes(model), TensorSizes(model, inferred=typed)
        names = {t for n in model.graph.node for t in [*n.input, *n.output] if t}
        assert all(own.raw_dims(t) == taken.raw_dims(t) and own.declared(t) == taken.declared(t) for t in names)
        assert check_runtime_support(model, name) is None  # without shapes: nothing inferred
    loaded = load_model(artifacts_dir("gpt"))
    assert loaded.inferred is not None and loaded.take_inferred() is not None and loaded.inferred is None
