"""Training-graph analysis: loss, regions, parameters and stashed activations."""

from __future__ import annotations

import onnx
import pytest
from conftest import artifacts_dir

from onnx_remat.analysis.model import analyze_model
from onnx_remat.analysis.regions import analyze
from onnx_remat.errors import RematError
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
