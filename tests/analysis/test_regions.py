"""Training-graph analysis: loss, regions, parameters and stashed activations."""

from __future__ import annotations

import onnx
import pytest
from conftest import artifacts_dir

from onnx_remat.analysis.model import analyze_model
from onnx_remat.analysis.regions import analyze, is_forward_only
from onnx_remat.errors import ForwardOnlyGraph, RematError
from onnx_remat.graph.bridge import ModelGraph
from onnx_remat.graph.conventions import GRADIENT_DOC


@pytest.fixture(scope="module")
def blocks10():
    return analyze_model(artifacts_dir("blocks10"))


def test_blocks10_regions(blocks10):
    tg = blocks10.graph
    counts = tg.counts()
    assert counts["nodes"] == 307
    assert counts["forward_nodes"] + counts["backward_nodes"] == 307
    assert counts["parameters"] == 10 and counts["gradient_accumulators"] == 10
    assert tg.loss.name == blocks10.model.graph.output[0].name
    assert tg.seed.name == tg.loss.name + "_grad"
    assert sorted(p.name for p in tg.parameters) == [f"blocks.{i}.y" for i in range(10)]


def test_every_marked_gradient_node_is_backward_and_the_loss_is_forward(blocks10):
    tg = blocks10.graph
    for node in tg.order:
        if blocks10.graph.mg.extras(node).doc_string == GRADIENT_DOC:
            assert tg.is_backward(node), node.name
    assert tg.is_forward(tg.loss.inputs[0])


def test_stashed_activations_are_forward_tensors_read_by_backward_nodes(blocks10):
    tg = blocks10.graph
    names = {t.name for t in tg.stashed}
    assert "/blocks.3/Softmax_output_0" in names  # SoftmaxGrad reads the softmax output
    assert "/blocks.3/drop/Dropout_output_1" in names  # DropoutGrad reads the mask
    assert "/blocks.3/Add_output_0" not in names  # Add's gradient needs no input
    for t in tg.stashed:
        assert tg.is_forward(t.inputs[0])
        assert tg.backward_consumers(t)


def test_gradient_nodes_never_get_a_scope(blocks10):
    for node in blocks10.graph.backward_nodes:
        assert blocks10.scopes.scope_of(node) is None


def test_forward_only_graph_is_refused():
    model = onnx.load(str(artifacts_dir("blocks10") / "eval_model.onnx"))
    with pytest.raises(RematError, match="forward-only graph.*generate_artifacts"):
        analyze(ModelGraph(model))


# -- the forward-only test read off the NodeProtos, and the analysis that defers its graph ---------

EXAMPLES = ("blocks10", "blocks10_dynamo", "fc5", "gpt", "resnet")


def _refused_by_analyze(model: onnx.ModelProto) -> bool:
    try:
        analyze(ModelGraph(model))
    except ForwardOnlyGraph:
        return True
    except RematError:
        return False  # another refusal: the graph has gradient nodes
    return False


def _with_node(model: onnx.ModelProto, node: onnx.NodeProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.node.append(node)
    return out


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize("which", ["training", "eval"])
def test_is_forward_only_agrees_with_analyze(name, which):
    model = onnx.load(str(artifacts_dir(name) / f"{which}_model.onnx"))
    assert is_forward_only(model) == _refused_by_analyze(model) == (which == "eval")


def test_is_forward_only_sees_each_kind_of_gradient_evidence():
    """A node the gradient builder made (doc string, name, accumulator op) or a ``<loss>_grad``
    seed makes a graph a training graph, for both tests alike."""
    model = onnx.load(str(artifacts_dir("fc5") / "eval_model.onnx"))
    out = model.graph.output[0].name
    first = model.graph.node[0].output[0]
    variants = {
        "doc": _with_node(model, onnx.helper.make_node("Identity", [out], ["d"], doc_string=GRADIENT_DOC)),
        "name": _with_node(model, onnx.helper.make_node("Identity", [out], ["n"], name="x_Grad/Identity_0")),
        "accumulator": _with_node(
            model, onnx.helper.make_node("ZeroGradient", [out, out], ["z"], domain="com.microsoft")
        ),
        # a seed named after a graph output, which no node makes
        "seed of an output": _with_node(model, onnx.helper.make_node("Identity", [out + "_grad"], ["s"])),
        # a seed named after a tensor a node makes, read by a node
        "seed of a tensor": _with_node(model, onnx.helper.make_node("Identity", [first + "_grad"], ["t"])),
    }
    assert is_forward_only(model) and _refused_by_analyze(model)
    for what, variant in variants.items():
        assert not is_forward_only(variant), what
        assert not _refused_by_analyze(variant), what
    # a "_grad" tensor a node makes is no seed
    made = _with_node(model, onnx.helper.make_node("Identity", [first], [first + "_grad"]))
    assert is_forward_only(made) and _refused_by_analyze(made)


@pytest.mark.parametrize("name", ["blocks10", "gpt", "resnet"])
def test_deferred_graph_is_the_graph_made_at_once(name):
    eager = analyze_model(artifacts_dir(name))
    deferred = analyze_model(artifacts_dir(name), defer_graph=True)
    assert deferred._training is None
    assert deferred.input_names == [t.name for t in eager.graph.graph.inputs]
    assert deferred.sizes._info == eager.sizes._info
    assert [n.name for n in deferred.graph.order] == [n.name for n in eager.graph.order]
    assert [t.name for t in deferred.graph.stashed] == [t.name for t in eager.graph.stashed]
    assert [s.path for s in deferred.scopes.root.walk()] == [s.path for s in eager.scopes.root.walk()]
    assert deferred.scopes.source == eager.scopes.source


def test_deferred_graph_refuses_a_forward_only_graph_at_once():
    with pytest.raises(ForwardOnlyGraph, match="forward-only graph.*training_model"):
        analyze_model(artifacts_dir("blocks10") / "eval_model.onnx", defer_graph=True)


@pytest.mark.parametrize("name", ["blocks10", "blocks10_dynamo", "gpt"])
def test_moved_transposes_read_off_the_nodes_as_off_the_graph(name):
    """The Transposes onnxruntime moves, found from the NodeProtos (what a deferred graph allows),
    are those the graphsurgeon graph gives."""
    analysis = analyze_model(artifacts_dir(name))
    emulation = analysis.emulation()
    by_graph = {
        n.name
        for n in analysis.graph.order
        if n.op == "Transpose"
        and not n.domain
        and not emulation.runs_as_written(
            n.name, [i.name for i in n.inputs], [c.name for o in n.outputs for c in o.outputs]
        )
    }
    transposes = [n for n in analysis.graph.order if n.op == "Transpose"]
    assert transposes
    assert analysis.moved_transposes(transposes) == by_graph
