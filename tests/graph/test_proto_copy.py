"""copy_except and with_nodes: a copy that leaves one field out, so nodes are copied once."""

import onnx
from onnx import helper

from onnx_remat.graph.node_list import with_nodes
from onnx_remat.graph.proto_copy import copy_except


def _model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu", doc_string="forward"),
        helper.make_node("Neg", ["a"], ["b"], name="neg"),
        helper.make_node("Abs", ["a"], ["c"], name="abs"),
    ]
    nodes[1].metadata_props.add(key="scope", value="blocks.0")
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2]) for n in ("b", "c")],
        initializer=[helper.make_tensor("w", onnx.TensorProto.FLOAT, [1], [1.0])],
        doc_string="graph doc",
    )
    model = helper.make_model(graph, producer_name="test", opset_imports=[helper.make_opsetid("", 17)])
    model.metadata_props.add(key="k", value="v")
    return model


def _copied_whole(model: onnx.ModelProto, nodes) -> onnx.ModelProto:
    """What with_nodes wrote before: the whole model copied, then its node list replaced."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def test_with_nodes_writes_what_a_whole_copy_would():
    model = _model()
    before = model.SerializeToString()
    nodes = list(model.graph.node)
    order = [nodes[2], nodes[0], nodes[1]]
    out = with_nodes(model, order)
    assert out.SerializeToString() == _copied_whole(model, order).SerializeToString()
    assert [n.name for n in out.graph.node] == ["abs", "relu", "neg"]
    assert model.SerializeToString() == before  # the input is not changed
    extra = helper.make_node("Identity", ["b"], ["d"], name="new")
    assert (
        with_nodes(model, [*nodes, extra]).SerializeToString()
        == _copied_whole(model, [*nodes, extra]).SerializeToString()
    )


def test_copy_except_leaves_the_field_out_and_the_input_alone():
    model = _model()
    before = model.SerializeToString()
    out = copy_except(model, "graph")
    assert not out.HasField("graph")
    expected = onnx.ModelProto()
    expected.CopyFrom(model)
    expected.ClearField("graph")
    assert out.SerializeToString() == expected.SerializeToString()
    into = onnx.ModelProto()
    copy_except(model.graph, "node", into=into.graph)
    assert len(into.graph.node) == 0 and into.graph.initializer[0].name == "w" and into.graph.doc_string == "graph doc"
    assert model.SerializeToString() == before


def test_copy_except_keeps_fields_the_schema_does_not_know():
    model = _model()
    wire = model.SerializeToString() + b"\xf8\x07\x2a"  # field 127, varint 42: unknown to ModelProto
    odd = onnx.ModelProto()
    odd.ParseFromString(wire)
    out = copy_except(odd, "graph")
    assert not out.HasField("graph")
    assert out.SerializeToString().endswith(b"\xf8\x07\x2a")
