"""ModelGraph.copy / TrainingGraph.copy: an independent copy, as if imported again; to_model's output."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from conftest import ARTIFACTS
from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter
from onnx_graphsurgeon.ir.tensor import LazyValues

import onnx_remat
from onnx_remat.analysis.model import analyze_model
from onnx_remat.analysis.regions import analyze
from onnx_remat.graph.bridge import ModelGraph, _value_info, tensor_map

MODELS = ("blocks10", "blocks10_dynamo", "fc5", "gpt", "resnet")
FILES = [f"{m}/{f}_model.onnx" for m in MODELS for f in ("training", "eval", "optimizer")]


def _edges(graph: gs.Graph) -> list:
    """Everything a graph's structure is: nodes and tensors by name, in list order, both edge ends."""
    nodes = [
        (n.op, n.name, n.domain, dict(n.attrs), [t.name for t in n.inputs], [t.name for t in n.outputs])
        for n in graph.nodes
    ]
    tensors = [
        (name, type(t).__name__, [p.name for p in t.inputs], [c.name for c in t.outputs])
        for name, t in graph.tensors().items()
    ]
    return [nodes, tensors, [t.name for t in graph.inputs], [t.name for t in graph.outputs]]


@pytest.mark.parametrize("name", FILES)
def test_copy_is_a_fresh_import(name):
    model = onnx.load(str(ARTIFACTS / name))
    mg = ModelGraph(model)
    copied = mg.copy().mg
    assert _edges(copied.graph) == _edges(ModelGraph(model).graph)
    assert copied.to_model().SerializeToString() == model.SerializeToString()
    for old, new in zip(mg.graph.nodes, copied.graph.nodes):
        assert new is not old and new.attrs is not old.attrs
        assert mg.extras(old) == copied.extras(new)


def test_copy_shares_constant_values_and_maps_every_object():
    mg = ModelGraph(onnx.load(str(ARTIFACTS / "gpt" / "training_model.onnx")))
    c = mg.copy()
    for t in mg.graph.tensors().values():
        new = c.tensor(t)
        assert new is not t and new.name == t.name and type(new) is type(t)
        if isinstance(t, gs.Constant):
            assert new._values is t._values  # parameters are never copied
    for n in mg.graph.nodes:
        assert [t.name for t in c.node(n).inputs] == [t.name for t in n.inputs]


def test_editing_the_copy_leaves_the_original_as_it_was():
    model = onnx.load(str(ARTIFACTS / "blocks10" / "training_model.onnx"))
    source = model.SerializeToString()
    mg = ModelGraph(model)
    before = _edges(mg.graph)
    copied = mg.copy().mg
    g = copied.graph
    node = next(n for n in g.nodes if len(n.inputs) >= 2 and n.attrs)
    node.inputs[0] = node.inputs[1]  # rewire
    node.attrs["added"] = 1
    node.name = "renamed"
    node.outputs[0].shape = None
    next(n for n in g.nodes if len(n.outputs) >= 2).outputs.pop()
    extra = gs.Node(op="Identity", name="extra", inputs=[g.inputs[0]], outputs=[gs.Variable("extra_out")])
    g.nodes.append(extra)
    copied.set_extras(extra, "added", {"k": "v"})
    copied.set_extras(g.nodes[0], "changed")
    constant = next(t for t in g.tensors().values() if isinstance(t, gs.Constant))
    constant.name = "renamed_constant"
    out = copied.to_model()
    assert _edges(mg.graph) == before
    assert mg.to_model().SerializeToString() == source
    assert model.SerializeToString() == source  # nor its source (a renamed constant is not renamed there)
    assert "renamed_constant" in [t.name for t in out.graph.initializer]


def test_a_constant_read_since_the_import_is_copied_as_imported():
    model = onnx.load(str(ARTIFACTS / "gpt" / "training_model.onnx"))
    mg = ModelGraph(model)
    constant = next(t for t in mg.graph.tensors().values() if isinstance(t, gs.Constant))
    _ = constant.values  # replaces the lazy reference with an array
    new = mg.copy().tensor(constant)
    assert isinstance(new._values, LazyValues) and new._values.tensor.name == constant.name


def test_unread_constants_gives_read_constants_their_lazy_reference_again():
    model = onnx.load(str(ARTIFACTS / "gpt" / "training_model.onnx"))
    mg = ModelGraph(model)
    constants = [t for t in mg.graph.tensors().values() if isinstance(t, gs.Constant)]
    for t in constants[::2]:
        _ = t.values  # replaces the lazy reference with an array
    mg.unread_constants()
    assert all(isinstance(t._values, LazyValues) and t._values.tensor.name == t.name for t in constants)
    assert mg.to_model().SerializeToString() == ModelGraph(model).to_model().SerializeToString()


@pytest.mark.parametrize("name", ["blocks10", "gpt", "resnet"])
def test_copied_analysis_is_the_analysis_of_the_copy(name):
    tg = analyze_model(ARTIFACTS / name).graph
    work, c = tg.copy()
    again = analyze(c.mg)

    def names(nodes):
        return [n.name for n in nodes]

    assert [id(n) for n in work.order] == [id(n) for n in again.order]
    assert work.position == again.position
    assert work.backward_ids == again.backward_ids
    assert work.loss is again.loss and work.seed is again.seed
    assert work.parameters == again.parameters and work.stashed == again.stashed
    assert list(work.tensors) == list(again.tensors)
    assert all(work.tensors[k] is again.tensors[k] for k in work.tensors)
    assert names(work.order) == names(tg.order)


@pytest.mark.parametrize("name,scope", [("blocks10", "Block"), ("gpt", "Block")])
def test_apply_leaves_the_analysed_graph_as_imported(name, scope):
    analysis = analyze_model(ARTIFACTS / name)
    source = analysis.model.SerializeToString()
    before = _edges(analysis.graph.graph)
    result = onnx_remat.apply(analysis, scopes=[scope])
    assert result.model.SerializeToString() != source
    assert _edges(analysis.graph.graph) == before
    assert analysis.graph.mg.to_model().SerializeToString() == source
    assert analysis.model.SerializeToString() == source


@pytest.mark.parametrize("shape", [None, [], [1, "batch", None], (3,)])
@pytest.mark.parametrize("dtype", [np.float32, np.dtype("int64"), np.bool_, onnx.TensorProto.BFLOAT16])
def test_value_info_is_graphsurgeons(shape, dtype):
    tensor = gs.Variable("x", dtype=dtype, shape=shape)
    ours = _value_info(tensor, {})
    assert ours.SerializeToString() == OnnxExporter.export_value_info_proto(tensor, False).SerializeToString()


def test_a_graph_with_subgraphs_is_imported_again():
    from onnx import TensorProto, helper

    def branch(name: str) -> onnx.GraphProto:
        node = helper.make_node("Identity", ["x"], [f"{name}_out"], name=f"{name}_id")  # reads the outer x
        return helper.make_graph(
            [node], name, [], [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [2])]
        )

    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    node = helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch("then"), else_branch=branch("else"))
    model = helper.make_model(helper.make_graph([node], "g", [cond, x], [y]))
    mg = ModelGraph(model)
    c = mg.copy()
    assert c.node(mg.graph.nodes[0]) is c.mg.graph.nodes[0] is not mg.graph.nodes[0]
    assert c.tensor(mg.graph.inputs[1]).name == "x" and c.tensor(mg.graph.inputs[1]) is not mg.graph.inputs[1]
    # (graphsurgeon writes subgraphs differently from the source: the copy writes what the original writes)
    assert c.mg.to_model().SerializeToString() == mg.to_model().SerializeToString()


def test_released_graph_is_freed_without_the_cyclic_collector():
    """release() breaks the node <-> tensor cycles, so dropping the graph frees it by reference
    counting alone; a graph not released stays until the cyclic collector runs."""
    import gc
    import weakref

    model = onnx.load(str(ARTIFACTS / "blocks10/training_model.onnx"))
    gc.collect()
    gc.disable()
    try:
        kept = ModelGraph(model).copy().mg
        kept_ref = weakref.ref(kept.graph.nodes[0])
        released = ModelGraph(model).copy().mg
        released_refs = [weakref.ref(released.graph.nodes[0]), weakref.ref(released.graph.nodes[0].outputs[0])]
        released.release()
        del kept, released
        assert all(r() is None for r in released_refs)
        assert kept_ref() is not None  # the cycles of an unreleased graph wait for the collector
    finally:
        gc.enable()
        gc.collect()


def _tensor_fields(graph: gs.Graph) -> list:
    """Every tensor's fields but its edges (those are in _edges), and which tensor objects the
    nodes share."""
    out = []
    for name, t in graph.tensors().items():
        d = {k: v for k, v in t.__dict__.items() if k not in ("inputs", "outputs", "_values")}
        values = t.__dict__.get("_values")
        if values is not None:
            d["_values"] = (type(values).__name__, values.tensor.SerializeToString())
        out.append((name, type(t).__name__, sorted((k, repr(v)) for k, v in d.items())))
    index: dict[int, int] = {}
    shared = [[index.setdefault(id(t), len(index)) for t in n.inputs + n.outputs] for n in graph.nodes]
    return [
        out,
        shared,
        sorted((k, repr(v)) for k, v in graph.__dict__.items() if k not in ("nodes", "inputs", "outputs")),
    ]


@pytest.mark.parametrize("name", FILES)
def test_import_graph_builds_what_graphsurgeon_imports(name):
    from onnx_remat.graph.bridge import import_graph

    model = onnx.load(str(ARTIFACTS / name))
    ours, theirs = import_graph(model), gs.import_onnx(model)
    assert _edges(ours) == _edges(theirs)
    assert _tensor_fields(ours) == _tensor_fields(theirs)
    assert [(n.__dict__.keys(), type(n.attrs), repr(n.attrs)) for n in ours.nodes] == [
        (n.__dict__.keys(), type(n.attrs), repr(n.attrs)) for n in theirs.nodes
    ]


def test_import_graph_keeps_graphsurgeons_precedence_for_odd_graphs():
    """Names graphsurgeon resolves by precedence: an initializer also declared in value_info and as
    an input, a value_info repeated with more detail, an omitted optional input (a new empty tensor
    each time), a tensor no node or declaration makes, a Constant attribute."""
    from onnx import TensorProto, helper

    from onnx_remat.graph.bridge import import_graph

    w = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    nodes = [
        helper.make_node("Add", ["x", "w"], ["y"], name="add"),
        helper.make_node("Clip", ["y", "", "nowhere"], ["z"], name="clip"),
        helper.make_node("Clip", ["z", ""], ["u"], name="clip2"),
        helper.make_node(
            "Constant", [], ["c"], name="const", value=helper.make_tensor("v", TensorProto.FLOAT, [1], [3.0])
        ),
        helper.make_node("Mul", ["u", "c"], ["out"], name="mul"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        initializer=[w],
        value_info=[
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"]),
            helper.make_tensor_value_info("out", TensorProto.FLOAT, [2]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ours, theirs = import_graph(model), gs.import_onnx(model)
    assert _edges(ours) == _edges(theirs)
    assert _tensor_fields(ours) == _tensor_fields(theirs)
    assert [repr(n.attrs) for n in ours.nodes] == [repr(n.attrs) for n in theirs.nodes]


@pytest.mark.parametrize("name", ["blocks10", "gpt", "resnet"])
def test_tensor_map_is_graphsurgeons(name):
    mg = ModelGraph(onnx.load(str(ARTIFACTS / name / "training_model.onnx"), load_external_data=False))
    assert list(tensor_map(mg.graph).items()) == list(mg.graph.tensors().items())


def test_tensor_map_of_odd_graphs_is_graphsurgeons():
    x, y, z = gs.Variable("x", np.float32), gs.Variable("y", np.float32), gs.Variable("z", np.float32)
    empty = [gs.Variable(""), gs.Variable("")]  # omitted optional inputs: no tensor
    graph = gs.Graph(
        nodes=[gs.Node("Dropout", inputs=[x, *empty], outputs=[y]), gs.Node("Relu", inputs=[y], outputs=[z])],
        inputs=[x],
        outputs=[z, y],
    )
    assert list(tensor_map(graph).items()) == list(graph.tensors().items()) == [("x", x), ("y", y), ("z", z)]
    twin = gs.Variable("y", np.float32)  # a distinct tensor of the same name: graphsurgeon warns, keeps the last
    graph.nodes.append(gs.Node("Relu", inputs=[z], outputs=[twin]))
    graph.outputs = [z]
    assert list(tensor_map(graph).items()) == list(graph.tensors().items())
    assert tensor_map(graph)["y"] is twin


def _built(make_node, make_variable) -> gs.Graph:
    """A small graph made with the given constructors: a node with attributes, one without a
    name or attributes, a tensor read twice, an omitted optional input, a domain."""
    x = make_variable("x", dtype=np.float32, shape=[2, 3])
    w = make_variable("w", dtype=np.float32, shape=[3, 3])
    y = make_variable("y", dtype=np.float32, shape=[2, 3])
    z = make_variable("z")
    empty = make_variable("")
    a = make_node(op="MatMul", name="mm", inputs=[x, w], outputs=[y])
    b = make_node(op="Dropout", inputs=[y, empty], outputs=[z], attrs={"seed": 1}, domain="com.microsoft")
    c = make_node("Add", "add", None, [y, z], [make_variable("out", np.float32, (2, 3))])
    return gs.Graph(nodes=[a, b, c], inputs=[x], outputs=[c.outputs[0]])


def test_new_node_and_new_variable_build_what_graphsurgeons_constructors_build():
    from onnx_remat.graph.bridge import new_node, new_variable

    ours, theirs = _built(new_node, new_variable), _built(gs.Node, gs.Variable)
    assert _edges(ours) == _edges(theirs)
    assert _tensor_fields(ours) == _tensor_fields(theirs)
    assert [(n.__dict__.keys(), type(n.attrs), repr(n.attrs), n.domain) for n in ours.nodes] == [
        (n.__dict__.keys(), type(n.attrs), repr(n.attrs), n.domain) for n in theirs.nodes
    ]
    # the edges are graphsurgeon's synchronized lists: an edit through one end updates the other
    y = ours.nodes[0].outputs[0]
    ours.nodes[2].inputs[0] = ours.nodes[0].inputs[0]
    assert ours.nodes[2] not in y.outputs and ours.nodes[2] in ours.nodes[0].inputs[0].outputs
