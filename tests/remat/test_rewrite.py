"""The rewrite: clones and barriers, their names and tags, ordering, what is kept of the model."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from conftest import artifacts_dir

from onnx_remat import apply
from onnx_remat.analysis.model import analyze_model
from onnx_remat.errors import RematError
from onnx_remat.graph import tags
from onnx_remat.remat.rewrite import RecomputeRewrite


@pytest.fixture(scope="module")
def result():
    return apply(artifacts_dir("blocks10"), scopes="Block")


def _meta(node: onnx.NodeProto) -> dict[str, str]:
    return {p.key: p.value for p in node.metadata_props}


def test_clones_are_named_tagged_and_behind_their_barrier(result):
    model = result.model
    producer = {o: n for n in model.graph.node for o in n.output}
    clones = [n for n in model.graph.node if _meta(n).get(tags.ROLE_KEY) == tags.ROLE_CLONE]
    barriers = [n for n in model.graph.node if _meta(n).get(tags.ROLE_KEY) == tags.ROLE_BARRIER]
    assert len(clones) == result.clone_count == 100
    assert len(barriers) == 10
    for clone in clones:
        meta = _meta(clone)
        assert tags.is_clone_name(clone.name) and clone.name == meta[tags.SOURCE_KEY] + "/remat"
        assert "onnx-remat clone" in clone.doc_string
        seg = meta[tags.SEGMENT_KEY]
        # Gated: at least one input comes from this segment's barrier or another clone of it.
        sources = {producer[i].name for i in clone.input if i in producer}
        assert sources & ({tags.barrier_name(seg)} | {c.name for c in clones if _meta(c)[tags.SEGMENT_KEY] == seg})
    for barrier in barriers:
        assert barrier.op_type == "PassThrough" and barrier.domain == "com.microsoft"
        assert len(barrier.input) == len(barrier.output)
        # The trigger is a gradient tensor: the gradient of the block's output.
        seg = _meta(barrier)[tags.SEGMENT_KEY]
        assert barrier.input[-1] == f"/{seg}/MatMul_1_output_0_grad"


def test_dropout_is_replayed_from_its_mask(result):
    replays = [n for n in result.model.graph.node if n.op_type == "DropoutGrad" and tags.is_clone_name(n.name)]
    assert len(replays) == 9  # block 0's dropout output is not stashed
    producer = {o: n for n in result.model.graph.node for o in n.output}
    r = next(n for n in replays if n.name == "/blocks.4/drop/Dropout/remat")
    # The mask is stored packed and unpacked behind the barrier (mask_packing has the details)...
    assert r.input[1] == "/blocks.4/drop/Dropout_output_1/remat"
    assert tags.is_unpack_name(producer[r.input[1]].name)
    # ...except for the block the backward pass reaches first, whose mask stays bytes.
    last = next(n for n in replays if n.name == "/blocks.9/drop/Dropout/remat")
    assert last.input[1] == "/blocks.9/drop/Dropout_output_1" + tags.GATE_INFIX + "blocks.9"
    assert not any(n.op_type == "Dropout" and tags.is_clone_name(n.name) for n in result.model.graph.node)


def test_backward_reads_clones_and_forward_tensors_are_released(result):
    softmax, dropout = "/blocks.4/Softmax_output_0", "/blocks.4/drop/Dropout"
    readers = [n for n in result.model.graph.node if softmax in n.input]
    # Only the forward reader is left: the Dropout, through a fence (a reader count of one would let
    # onnxruntime fuse). No random-op pin: the data orders the blocks' dropouts already.
    assert [n.name for n in readers] == [tags.fence_name(softmax)]
    fenced = [n.name for n in result.model.graph.node if tags.fence_tensor_name(softmax) in n.input]
    assert fenced == [dropout]
    assert result.rewrite.random_order_pins == []
    softmax_grad = next(n for n in result.model.graph.node if n.name == "/blocks.4/Softmax_Grad/SoftmaxGrad_13_0")
    assert "/blocks.4/Softmax_output_0/remat" in softmax_grad.input


def test_clones_sit_right_before_their_first_reader(result):
    names = [n.name for n in result.model.graph.node]
    for seg in result.rewrite.segments:
        at = names.index(seg.first_consumer)
        block = names[at - 1 - len(seg.clones) - len(seg.unpacked) : at]
        assert block[0] == seg.barrier and sorted(block[1:]) == sorted(seg.clones + seg.unpacked)
        assert [n for n in block if n in seg.clones] == seg.clones


def test_model_fields_are_kept(result):
    src = onnx.load(str(artifacts_dir("blocks10") / "training_model.onnx"))
    out = result.model
    assert out.ir_version == src.ir_version <= 10
    assert [(o.domain, o.version) for o in out.opset_import] == [(o.domain, o.version) for o in src.opset_import]
    assert [i.name for i in out.graph.input] == [i.name for i in src.graph.input]
    assert [o.name for o in out.graph.output] == [o.name for o in src.graph.output]
    by_name = {n.name: n for n in out.graph.node}
    for node in src.graph.node:  # every original node is still there, unchanged but its inputs
        kept = by_name[node.name]
        assert kept.op_type == node.op_type and kept.doc_string == node.doc_string
        assert kept.metadata_props == node.metadata_props
    plan_meta = json.loads({p.key: p.value for p in out.metadata_props}[tags.PLAN_KEY])
    assert [s["label"] for s in plan_meta] == [f"blocks.{i}" for i in range(10)]
    onnx.checker.check_model(out)


def test_a_rewritten_graph_is_not_rewritten_again(tmp_path, result):
    path = result.save(tmp_path / "once.onnx")
    with pytest.raises(RematError, match="already rewritten by onnx-remat"):
        apply(path, scopes="blocks.*")


def test_without_barrier_clones_read_the_originals():
    analysis = analyze_model(artifacts_dir("blocks10"))
    from onnx_remat.remat.apply import plan

    naive = RecomputeRewrite(barrier=False)(analysis.graph, plan(analysis, scopes="Block"))
    assert not any(tags.is_barrier_name(n.name) for n in naive.model.graph.node)
    div = next(n for n in naive.model.graph.node if n.name == "/blocks.4/Div/remat")
    assert div.input[0] == "/blocks.3/MatMul_1_output_0"


def test_a_rewrite_in_a_forked_child_is_the_rewrite_on_a_copy(monkeypatch):
    """On a large graph the rewrite edits the graph in place in a forked child (no copy): same model,
    same segments (the caller's plan's own), the caller's analysis untouched; a failed child's
    rewrite is made here, on a copy."""
    from onnx_remat import forked
    from onnx_remat.forked import Forked
    from onnx_remat.remat.apply import plan as make_plan

    analysis = analyze_model(artifacts_dir("blocks10"))
    # Constants whose values were read (an array now, not the source's TensorProto) are written as a
    # fresh import writes them, in the child as on a copy: read them all.
    constants = [t for t in analysis.graph.tensors.values() if isinstance(t, gs.Constant)]
    assert all(isinstance(t.values, np.ndarray) for t in constants)
    assert constants
    plan = make_plan(analysis, scopes="Block")
    before = analysis.graph.mg.to_model().SerializeToString()
    on_copy = RecomputeRewrite()(analysis.graph, plan)

    children = []
    start = Forked.start.__func__  # type: ignore[attr-defined]

    def counted(cls, compute, **kw):
        children.append(kw.get("child"))
        return start(cls, compute, **kw)

    monkeypatch.setattr(Forked, "start", classmethod(counted))
    monkeypatch.setattr(forked, "FORK_MIN_NODES", 0)
    in_child = RecomputeRewrite()(analysis.graph, plan)
    assert len(children) == 1 and children[0] is not None

    def failing(self, tg, plan):
        raise RuntimeError("the child fails")

    monkeypatch.setattr(RecomputeRewrite, "_in_place", failing)
    after_failure = RecomputeRewrite()(analysis.graph, plan)
    assert len(children) == 2
    for result in (in_child, after_failure):
        assert result.model.SerializeToString() == on_copy.model.SerializeToString()
        assert [s.summary() for s in result.segments] == [s.summary() for s in on_copy.segments]
        assert [s.segment for s in result.segments] == plan.segments
        assert all(s.segment is p for s, p in zip(result.segments, plan.segments))
        assert (result.fences, result.packed_masks) == (on_copy.fences, on_copy.packed_masks)
    assert analysis.graph.mg.to_model().SerializeToString() == before
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match="only a forked child"):
        RecomputeRewrite()._in_place(analysis.graph, plan)


def test_the_child_checks_its_rewrite_after_sending_it(monkeypatch):
    """On a large graph the child sends the rewrite, then checks its postconditions (ensures) while
    the caller orders it: result() comes first, ensured() is the same rewrite once the check
    passed. A check that fails in the child only is made again here (the rewrite made here is
    returned); one that fails here too raises as the rewrite without the fork does."""
    from onnx_remat import forked
    from onnx_remat.remat.apply import plan as make_plan

    analysis = analyze_model(artifacts_dir("blocks10"))
    plan = make_plan(analysis, scopes="Block")
    on_copy = RecomputeRewrite()(analysis.graph, plan)
    monkeypatch.setattr(forked, "FORK_MIN_NODES", 0)
    checked_in: list[bool] = []
    ensures = RecomputeRewrite.ensures

    def recorded(self, tg, result):
        checked_in.append(forked.in_forked_child())
        ensures(self, tg, result)

    monkeypatch.setattr(RecomputeRewrite, "ensures", recorded)
    underway = RecomputeRewrite().begin(analysis.graph, plan)
    first = underway.result()
    assert underway.ensured() is first
    assert first.model.SerializeToString() == on_copy.model.SerializeToString()
    assert checked_in == []  # checked in the child (its record stays there), not here

    def fails_in_the_child(self, tg, result):
        if forked.in_forked_child():
            raise RuntimeError("broken in the child")
        checked_in.append(False)

    monkeypatch.setattr(RecomputeRewrite, "ensures", fails_in_the_child)
    underway = RecomputeRewrite().begin(analysis.graph, plan)
    first = underway.result()
    again = underway.ensured()
    assert again is not first and checked_in == [False]  # made again, and checked, here
    assert again.model.SerializeToString() == on_copy.model.SerializeToString()
    assert all(s.segment is p for s, p in zip(again.segments, plan.segments))

    def fails(self, tg, result):
        raise RuntimeError("rewrite broke the topological order at node 'x'")

    monkeypatch.setattr(RecomputeRewrite, "ensures", fails)
    with pytest.raises(RuntimeError, match="topological order"):
        RecomputeRewrite()(analysis.graph, plan)


@pytest.mark.parametrize("broken", ["order", "tensor", "name"])
def test_ensures_refuses_a_broken_rewrite(broken):
    from onnx_remat.remat.apply import plan as make_plan
    from onnx_remat.remat.rewrite import _working_copy

    analysis = analyze_model(artifacts_dir("blocks10"))
    work, work_plan = _working_copy(analysis.graph, make_plan(analysis, scopes="Block"))
    rewrite = RecomputeRewrite()
    result = rewrite.call(work, work_plan)
    rewrite.ensures(work, result)  # as made
    nodes = work.graph.nodes
    clones = [k for k, n in enumerate(nodes) if tags.is_clone_name(n.name)]
    if broken == "order":  # a clone after the node reading it
        k = next(k for k in clones if nodes[k].outputs[0].outputs)
        reader = max(nodes.index(r) for r in nodes[k].outputs[0].outputs)
        nodes.insert(reader, nodes.pop(k))
        match = "topological order"
    elif broken == "tensor":
        nodes[clones[1]].outputs[0].name = nodes[clones[0]].outputs[0].name
        match = "produced tensor .* twice"
    else:
        nodes[clones[1]].name = nodes[clones[0]].name
        match = "produced node name .* twice"
    with pytest.raises(RuntimeError, match=match):
        rewrite.ensures(work, result)


def test_a_graph_spanning_graphs_is_rewritten_on_a_copy_in_the_child_too(monkeypatch):
    """ModelGraph.copy imports a graph with subgraphs or local functions again; the forked child's
    rewrite of one is made on such a copy too, not in place."""
    from onnx_remat import forked
    from onnx_remat.graph.bridge import ModelGraph
    from onnx_remat.remat.apply import plan as make_plan

    analysis = analyze_model(artifacts_dir("blocks10"))
    plan = make_plan(analysis, scopes="Block")
    before = analysis.graph.mg.to_model().SerializeToString()
    monkeypatch.setattr(ModelGraph, "spans_graphs", lambda self: True)
    monkeypatch.setattr(forked, "_in_child", True)  # as in a forked child, without the fork
    result = RecomputeRewrite()._in_place(analysis.graph, plan)
    assert analysis.graph.mg.to_model().SerializeToString() == before  # not edited in place
    monkeypatch.undo()
    on_copy = RecomputeRewrite()(analysis.graph, plan)
    assert result.model.SerializeToString() == on_copy.model.SerializeToString()
