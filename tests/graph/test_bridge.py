"""onnx-graphsurgeon bridge: lossless round trip, extras kept, iterative toposort."""

from __future__ import annotations

import random

import onnx
import onnx_graphsurgeon as gs
import pytest
from conftest import ARTIFACTS
from onnx import TensorProto, helper

from onnx_remat.errors import RematError
from onnx_remat.graph.bridge import ModelGraph
from onnx_remat.graph.toposort import stable_toposort

# the committed example models only: a user's output in models/artifacts/ is not a test input
MODELS = ("blocks10", "blocks10_dynamo", "fc5", "gpt", "resnet")
FILES = [f"{m}/{f}_model.onnx" for m in MODELS for f in ("training", "eval", "optimizer")]


@pytest.mark.parametrize("name", FILES)
def test_round_trip_is_byte_identical(name):
    model = onnx.load(str(ARTIFACTS / name))
    assert ModelGraph(model).to_model().SerializeToString() == model.SerializeToString()


def test_edits_keep_doc_strings_and_metadata_of_other_nodes():
    model = onnx.load(str(ARTIFACTS / "blocks10_dynamo" / "eval_model.onnx"))
    mg = ModelGraph(model)
    first = mg.graph.nodes[0]
    extra = gs.Node(op="Identity", name="added", inputs=[first.outputs[0]], outputs=[gs.Variable("added_out")])
    mg.graph.nodes.append(extra)
    mg.set_extras(extra, "doc of added", {"k": "v"})
    out = mg.to_model(extra_opsets={"com.microsoft": 1}, metadata={"m": "1"})
    by_name = {n.name: n for n in out.graph.node}
    for proto in model.graph.node:
        assert by_name[proto.name].metadata_props == proto.metadata_props
        assert by_name[proto.name].doc_string == proto.doc_string
    assert by_name["added"].doc_string == "doc of added"
    assert {p.key: p.value for p in by_name["added"].metadata_props} == {"k": "v"}
    assert ("com.microsoft", 1) in [(o.domain, o.version) for o in out.opset_import]
    assert out.ir_version == model.ir_version
    assert {p.key: p.value for p in out.metadata_props}["m"] == "1"


def _chain(n: int) -> list[gs.Node]:
    tensors = [gs.Variable(f"t{i}") for i in range(n + 1)]
    return [gs.Node(op="Relu", name=f"n{i}", inputs=[tensors[i]], outputs=[tensors[i + 1]]) for i in range(n)]


def test_toposort_keeps_a_sorted_list():
    nodes = _chain(50)
    assert stable_toposort(nodes) == nodes


def test_toposort_sorts_long_reversed_chains_without_recursion():
    nodes = _chain(50_000)  # graphsurgeon's recursive toposort fails far below this
    assert [n.name for n in stable_toposort(list(reversed(nodes)))] == [n.name for n in nodes]


def test_toposort_is_stable_for_independent_nodes():
    nodes = _chain(20)
    random.Random(0).shuffle(nodes)
    free = [
        gs.Node(op="Relu", name=f"free{i}", inputs=[gs.Variable(f"in{i}")], outputs=[gs.Variable(f"o{i}")])
        for i in range(5)
    ]
    order = stable_toposort(free + nodes)
    assert [n.name for n in order[:5]] == [f"free{i}" for i in range(5)]


def test_toposort_reports_cycles():
    a, b = gs.Variable("a"), gs.Variable("b")
    n1 = gs.Node(op="Relu", name="n1", inputs=[a], outputs=[b])
    n2 = gs.Node(op="Relu", name="n2", inputs=[b], outputs=[a])
    with pytest.raises(RematError, match="cycle"):
        stable_toposort([n1, n2])


def test_round_trip_of_a_model_without_metadata():
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    assert ModelGraph(model).to_model().SerializeToString() == model.SerializeToString()
