"""Planning: which nodes each selection recomputes, what stays stored, what is skipped."""

from __future__ import annotations

import pytest
from conftest import MiB, artifacts_dir

from onnx_remat.analysis.model import analyze_model
from onnx_remat.errors import RematError
from onnx_remat.remat.apply import plan


@pytest.fixture
def blocks10():
    return analyze_model(artifacts_dir("blocks10"))


def test_clone_limit_stops_a_staged_plan_before_it_is_built(blocks10, monkeypatch):
    """The stages of a long --recompute-outputs chain clone O(layers^2) nodes; with ``clone_limit``
    the planner stops at the first stage past it instead of building them all."""
    from onnx_remat.remat import plan as plan_module

    selection = plan_module.Selection(scopes=["Block"], recompute_outputs=True)
    planner = plan_module.Planner(blocks10.graph, blocks10.scopes, blocks10.sizes)
    full = planner.plan(selection)
    cloned = sum(len(s.recompute) for s in full.segments)
    assert planner.plan(selection, clone_limit=cloned).segments  # at the limit: built in full
    built: list[int] = []
    real = plan_module.Planner._segment
    monkeypatch.setattr(
        plan_module.Planner,
        "_segment",
        lambda self, *a: built.append(1) or real(self, *a),  # type: ignore[func-returns-value]
    )
    limit = len(full.segments[0].recompute) + 1
    with pytest.raises(plan_module.CloneLimitExceeded) as stopped:
        planner.plan(selection, clone_limit=limit)
    assert stopped.value.limit == limit and stopped.value.cloned > limit
    assert len(built) == 2  # the first two stages, not all ten
    # The limit is of that call only.
    assert [s.label for s in planner.plan(selection).segments] == [s.label for s in full.segments]


def test_per_block_plan(blocks10):
    p = plan(blocks10, scopes="Block", dropout="byte")
    assert [s.label for s in p.segments] == [f"blocks.{i}" for i in range(10)]
    seg = p.segments[3]
    # Every Block node is recomputed except its output node (MatMul_1, read by the next block).
    assert sorted(n.name for n in seg.recompute) == sorted(
        f"/blocks.3/{n}"
        for n in ("Div", "Transpose", "Div_1", "MatMul", "Unsqueeze", "Sub", "Mul", "Add", "Softmax", "drop/Dropout")
    )
    assert "/blocks.3/MatMul_1_output_0" in [t.name for t in seg.kept]
    # The dropout mask stays stored (dropout="byte"); the dropout output is replayed from it.
    assert "/blocks.3/drop/Dropout_output_1" in [t.name for t in seg.kept]
    assert "/blocks.3/drop/Dropout_output_0" in [t.name for t in seg.targets]
    # Clones read the block input and the parameter from storage.
    assert {"/blocks.2/MatMul_1_output_0", "blocks.3.y"} <= {t.name for t in seg.boundary}
    # Div, Div_1 (2 MiB each), Softmax and dropout output (8 MiB each) are released.
    assert seg.released_bytes == 20 * MiB
    assert p.released_bytes == 190 * MiB and not p.unknown_sizes


def test_op_type_selection_pulls_in_what_is_not_stored(blocks10):
    p = plan(blocks10, op_types="Softmax")
    assert len(p.segments) == 10
    seg = p.segments[5]
    ops = sorted(n.op for n in seg.recompute)
    # Softmax needs Add, which is not stored, so Add and its producers are recomputed too,
    # down to tensors stored anyway (Div outputs, read by the MatMul gradient; the parameter).
    assert ops == sorted(["Softmax", "Add", "MatMul", "Mul", "Sub", "Unsqueeze"])
    assert {"/blocks.5/Div_output_0", "/blocks.5/Div_1_output_0"} <= {t.name for t in seg.boundary}
    assert [t.name for t in seg.targets] == ["/blocks.5/Softmax_output_0"]
    assert seg.released_bytes == 8 * MiB


def test_node_selection_and_its_errors(blocks10):
    p = plan(blocks10, nodes=["/blocks.2/Softmax"])
    assert [s.label for s in p.segments] == ["/blocks.2/Softmax"]
    with pytest.raises(RematError, match=r"no node named '/blocks.2/Softmx'; closest: /blocks.2/Softmax"):
        plan(blocks10, nodes=["/blocks.2/Softmx"])
    grad = next(n.name for n in blocks10.graph.backward_nodes)
    with pytest.raises(RematError, match="is a gradient node"):
        plan(blocks10, nodes=[grad])
    with pytest.raises(RematError, match=r"op type 'Softmaks' matches no forward node; closest: Softmax"):
        plan(blocks10, op_types="Softmaks")


def test_random_ops_are_never_recomputed(blocks10):
    p = plan(blocks10, op_types="Dropout", dropout="byte")
    # A Dropout's output is replayed from its stored mask, never redrawn.
    for seg in p.segments:
        assert all(t.name.endswith("Dropout_output_0") for t in seg.targets)
        assert any(t.name.endswith("Dropout_output_1") for t in seg.boundary)


def test_recompute_outputs_stages_the_merged_scopes(blocks10):
    p = plan(blocks10, scopes="blocks.[0-1]", recompute_outputs=True)
    # One group, recomputed in two stages: each when the backward pass reaches its scope.
    assert [(s.label, s.group) for s in p.segments] == [
        ("blocks.0", "blocks.0..blocks.1"),
        ("blocks.1", "blocks.0..blocks.1"),
    ]
    first, second = p.segments
    # blocks.0's output is not stored: blocks.1's stage recomputes it (and blocks.0 on the way),
    # starting from the group's input x.
    assert "/blocks.0/MatMul_1_output_0" in [t.name for t in second.targets]
    assert "/blocks.0/MatMul_1" in [n.name for n in second.recompute]
    assert "x" in [t.name for t in second.boundary]
    assert "/blocks.0/MatMul_1_output_0" not in [t.name for t in second.boundary]
    assert "/blocks.1/MatMul_1" not in [n.name for n in second.recompute]  # the group's output stays stored
    assert all(n.name.startswith("/blocks.0/") for n in first.recompute)
    assert any("--recompute-outputs merged blocks.0 + blocks.1" in n for n in p.notes)
    separate = plan(blocks10, scopes="blocks.[0-1]")
    assert [(s.label, s.group) for s in separate.segments] == [("blocks.0", None), ("blocks.1", None)]
    assert "/blocks.0/MatMul_1" not in [n.name for s in separate.segments for n in s.recompute]


def _small_from_big(tmp_path):
    """A training graph where scope ``small`` stashes 1 KiB computed from a 256 KiB tensor of ``big``."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.training import artifacts

    w = numpy_helper.from_array(np.ones((64, 256), np.float32), "big.w")
    v = numpy_helper.from_array(np.ones((256, 1), np.float32), "v")
    nodes = [
        helper.make_node("MatMul", ["x", "big.w"], ["B"], name="/big/MatMul"),
        # T = B @ v: its gradient w.r.t. B does not read B, so B is not stashed.
        helper.make_node("MatMul", ["B", "v"], ["T"], name="/small/MatMul"),
        helper.make_node("Mul", ["T", "T"], ["y"], name="/small/Mul"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 1])],
        initializer=[w, v],
    )
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 18)])
    artifacts.generate_artifacts(
        model,
        requires_grad=["big.w"],
        loss=artifacts.LossType.MSELoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=str(tmp_path),
    )
    return tmp_path


def test_segments_that_would_not_lower_memory_are_skipped(tmp_path):
    analysis = analyze_model(_small_from_big(tmp_path))
    assert "T" in {t.name for t in analysis.graph.stashed}
    assert "B" not in {t.name for t in analysis.graph.stashed}
    p = plan(analysis, scopes="small")
    assert p.segments == []
    assert [s.label for s in p.skipped] == ["small"]
    assert "would not lower memory: releases 1024 B of stored activations but keeps 262144 B" in p.skipped[0].reason
    # Recomputing both scopes lowers memory: the MatMul is recomputed from stored inputs.
    both = plan(analysis, scopes=["small", "big"], recompute_outputs=True)
    assert [(s.label, s.group) for s in both.segments] == [("small", "big..small")]
    assert sorted(n.name for n in both.segments[0].recompute) == ["/big/MatMul", "/small/MatMul"]
    assert both.released_bytes == 1024


def test_nothing_selected_is_an_error(blocks10):
    with pytest.raises(RematError, match="nothing selected"):
        plan(blocks10)


def test_the_planner_judges_each_node_once(monkeypatch):
    """The budget model asks whether a node may be cloned, and whether it is a replayable Dropout,
    for every option of its unit: each node is judged once, and the answers are the judgements."""
    from onnx_remat.remat import plan as plan_module
    from onnx_remat.remat.budget import BudgetPlanner
    from onnx_remat.remat.plan import Planner

    judged: list[int] = []
    judge = Planner._judge_cloneable
    monkeypatch.setattr(Planner, "_judge_cloneable", lambda self, n: judged.append(id(n)) or judge(self, n))
    replays: list[int] = []
    is_replayable = plan_module.is_replayable
    monkeypatch.setattr(plan_module, "is_replayable", lambda n: replays.append(id(n)) or is_replayable(n))
    planner = BudgetPlanner(analyze_model(artifacts_dir("blocks10")))
    assert judged and len(judged) == len(set(judged))
    assert replays and len(replays) == len(set(replays))
    p = planner.model.planner
    for n in planner.analysis.graph.order:
        assert p.cloneable(n) == judge(p, n)
        assert p.replayable(n) == is_replayable(n)


PLANS = [
    ("blocks10", "Block", {}),  # packed: the segment recomputed first is built again, its masks bytes
    ("blocks10", "Block", {"dropout": "byte"}),
    ("blocks10", "Block", {"dropout": "seed"}),
    ("gpt", "Block", {"recompute_outputs": True}),
    ("blocks10_dynamo", "Block", {}),
]


def _plan_facts(p) -> list:
    return [
        (s.summary(), [t.name for t in s.boundary], [t.name for t in s.kept], [t.name for t in s.masks])
        for s in p.segments
    ] + [p.notes, [(s.label, s.reason) for s in p.skipped], sorted(p.mask_shapes.items())]


@pytest.mark.parametrize(("name", "scope", "options"), PLANS, ids=lambda c: str(c))
def test_segments_built_once_are_the_segments_built_again(name, scope, options, monkeypatch):
    """A planner takes a scope's segment from those built on the graph before (a plan's first
    build, another planner's: Planner's ``built``) only where it would build the same: a plan from
    a memo filled by a plan and a scope table is a plan built from nothing."""
    from onnx_remat.analysis.scope_table import scope_report
    from onnx_remat.remat import plan as plan_module

    analysis = analyze_model(artifacts_dir(name))
    plan(analysis, scopes=scope, **options)
    scope_report(analysis, dropout=options.get("dropout", "packed"))
    memo = plan_module.built_segments(analysis.memo, options.get("dropout", "packed"))
    assert memo
    remembered = plan(analysis, scopes=scope, **options)

    class Forgetful(dict):  # keeps no segment: each is built anew, in a plan's second build too
        def __setitem__(self, key, value) -> None:
            pass

    monkeypatch.setattr(plan_module, "built_segments", lambda memo, dropout: Forgetful())
    fresh = plan(analyze_model(artifacts_dir(name)), scopes=scope, **options)
    assert _plan_facts(remembered) == _plan_facts(fresh)
