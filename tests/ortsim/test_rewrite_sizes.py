"""A rewrite's sizes updated from the original's emulation (``rewrite_sizes``) are the sizes a fresh
inference of the rewritten graph finds (``TensorSizes`` then ``infer_runtime_shapes``): every
tensor's element type, shape and known-ness, on the example and synthetic graphs, for each kind of
rewrite (per layer, merged stages, byte and seeded dropout masks).

Not for the memory schedule's in-place gradient accumulation: the subgraph it adds for a tied
embedding (Unique, ConstantOfShape, ...) gets dimensions onnx's whole-graph inference names
(``unk__0``) and per-node inference does not, so that graph is inferred afresh."""

from __future__ import annotations

import onnx
import pytest
from conftest import artifacts_dir

import onnx_remat
from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.ortsim.emulation import emulate, emulate_rewrite
from onnx_remat.ortsim.shapes import infer_runtime_shapes, rewrite_sizes
from onnx_remat.remat.apply import plan
from onnx_remat.remat.rewrite import RecomputeRewrite


def _inferred(model: onnx.ModelProto, dims: dict[str, int]) -> TensorSizes:
    sizes = TensorSizes(model, dims)
    infer_runtime_shapes(model, sizes)
    return sizes


def _assert_same_sizes(model: onnx.ModelProto, got: TensorSizes, want: TensorSizes) -> int:
    names = {t for n in model.graph.node for t in [*n.input, *n.output] if t}
    names |= {vi.name for vi in [*model.graph.input, *model.graph.output]}
    for name in sorted(names):
        assert (name in got) == (name in want), name
        assert got.declared(name) == want.declared(name), name
        assert got.elem_type(name) == want.elem_type(name), name
        assert got.raw_dims(name) == want.raw_dims(name), name
        assert got.nbytes(name) == want.nbytes(name), name
    return len(names)


CASES = [
    ("blocks10", "Block", {}),
    ("blocks10", "Block", {"recompute_outputs": True}),
    ("blocks10", "Block", {"dropout": "byte"}),
    ("blocks10", "Block", {"dropout": "seed"}),
    ("blocks10_dynamo", "Block", {}),
    ("gpt", "Block", {}),
    ("gpt", "Block", {"recompute_outputs": True}),
    ("fc5", "FCBlock", {}),
    ("resnet", "layers.*", {}),
]


@pytest.mark.parametrize(("name", "scope", "options"), CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_rewrite_sizes_equal_a_fresh_inference(name, scope, options):
    analysis = onnx_remat.analyze_model(artifacts_dir(name))
    original = emulate(analysis.model, analysis.sizes)
    rewrite = RecomputeRewrite()(analysis.graph, plan(analysis, scopes=scope, **options)).model
    before = dict(original.sizes._nbytes)
    got = rewrite_sizes(original.sizes, rewrite)
    assert dict(original.sizes._nbytes) == before  # the original's sizes are not changed
    new_tensors = {o for n in rewrite.graph.node for o in n.output if o and o not in original.sizes}
    assert any(got.declared(t) for t in new_tensors)  # some new tensors, and sizes known for them
    assert _assert_same_sizes(rewrite, got, _inferred(rewrite, analysis.sizes.dims)) > len(analysis.model.graph.node)


def test_synthetic_rewrite_sizes_and_emulation(synthetic_dir):
    analysis = onnx_remat.analyze_model(synthetic_dir)
    original = emulate(analysis.model, analysis.sizes)
    rewrite = RecomputeRewrite()(analysis.graph, plan(analysis, scopes="blocks.*")).model
    want = _inferred(rewrite, analysis.sizes.dims)
    _assert_same_sizes(rewrite, rewrite_sizes(original.sizes, rewrite), want)
    updated = emulate_rewrite(rewrite, original.sizes)
    fresh = emulate(rewrite, TensorSizes(rewrite, analysis.sizes.dims))
    assert updated.order == fresh.order
    assert updated.plan.planned_peak_bytes == fresh.plan.planned_peak_bytes
    assert updated.plan.live_bytes == fresh.plan.live_bytes


class _Forgetful(dict):
    """A memo that keeps nothing: every node inferred on its own."""

    def __setitem__(self, key, value) -> None:
        pass


@pytest.mark.parametrize(("name", "scope", "options"), CASES[:5:2] + CASES[5:6], ids=lambda c: str(c))
def test_inference_by_signature_answers_as_each_node_inferred_alone(name, scope, options, monkeypatch):
    """A node whose signature (op, attributes, input types, shapes and constant values) was
    inferred already takes that answer: the sizes are those of inferring every node."""
    from onnx_remat.ortsim import shapes

    analysis = onnx_remat.analyze_model(artifacts_dir(name))
    rewrite = RecomputeRewrite()(analysis.graph, plan(analysis, scopes=scope, **options)).model
    remembered = _inferred(rewrite, analysis.sizes.dims)
    init = shapes._NodeInference.__init__

    def forgetful(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._inferred = _Forgetful()

    monkeypatch.setattr(shapes._NodeInference, "__init__", forgetful)
    alone = _inferred(rewrite, analysis.sizes.dims)
    assert remembered._info == alone._info
    assert len(remembered._info) > len(TensorSizes(rewrite, analysis.sizes.dims)._info)


@pytest.mark.parametrize(
    "dims", [(2, 3), (), ("batch", 4), ("", 5), (None, 7), ("seq", None, "")], ids=lambda d: str(d)
)
def test_declare_reads_a_shape_as_its_value_info_would(dims):
    model = onnx.load(str(artifacts_dir("fc5") / "training_model.onnx"))
    declared, read = TensorSizes(model, infer=False), TensorSizes(model, infer=False)
    declared.declare("new", onnx.TensorProto.FLOAT, dims)
    type_proto = onnx.helper.make_tensor_type_proto(
        onnx.TensorProto.FLOAT, [d if isinstance(d, (int, str)) else None for d in dims]
    )
    read.add_value_infos([onnx.helper.make_value_info("new", type_proto)])
    assert declared._info["new"] == read._info["new"]
    # a shape known already stays; a rank learnt for a tensor of unknown rank is taken
    declared.declare("new", onnx.TensorProto.FLOAT, (9,))
    assert declared._info["new"] == read._info["new"]


def _walked_whole(model: onnx.ModelProto, dims: dict[str, int]) -> TensorSizes:
    """infer_runtime_shapes as it was before it walked only the nodes left to infer: every node of
    the graph in its topological order, each one skipped where its outputs are declared."""
    from onnx_remat.graph.toposort import index_order
    from onnx_remat.ortsim.graph import node_io
    from onnx_remat.ortsim.shapes import _NodeInference, _small_constants

    sizes = TensorSizes(model, dims)
    nodes = list(model.graph.node)
    inference = _NodeInference(model, sizes, lambda: _small_constants(model.graph, nodes, 1024))
    inputs, outputs = node_io(model)
    outputs = [[o for o in outs if o] for outs in outputs]
    for i in index_order(inputs, outputs):
        if outputs[i] and not all(sizes.declared(o) for o in outputs[i]):
            inference.infer(nodes[i])
    return sizes


@pytest.mark.parametrize("name", ["blocks10", "gpt", "resnet"])
@pytest.mark.parametrize("unsorted", [False, True], ids=["as-exported", "reversed-node-list"])
def test_inference_of_the_pending_nodes_equals_a_walk_of_the_whole_graph(name, unsorted):
    """Only nodes with an undeclared output are walked, in a topological order of their own
    (_pending_order): the sizes equal those of a walk of every node in the whole graph's order, on
    the node list as exported and reversed (not sorted: each pending node then waits for pending
    producers listed after it). The value_info is dropped first so that most nodes are pending."""
    model = onnx.load(str(artifacts_dir(name) / "training_model.onnx"))
    del model.graph.value_info[:]
    if unsorted:
        reversed_nodes = list(model.graph.node)[::-1]
        del model.graph.node[:]
        model.graph.node.extend(reversed_nodes)
    want = _walked_whole(model, {})
    got = _inferred(model, {})
    assert _assert_same_sizes(model, got, want) > 100
    assert sum(got.declared(o) for n in model.graph.node for o in n.output if o) > 100
