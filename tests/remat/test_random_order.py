"""Random ops keep their draw order on every arrangement (issue: GPT-NeoX's parallel residual got an
internal error from every apply): pins only where the rewrite changes the order, and a node list
that stays topological wherever the pins go."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.graph import tags
from onnx_remat.graph.random_order import flipped_pairs, pin_random_order, random_ops
from onnx_remat.ortsim.emulation import emulate, keep_random_order


def _siblings() -> onnx.ModelProto:
    """Two sibling branches off ``x``, each ending in a Dropout, merged by one Add (the parallel
    residual's shape); the branch later in the node list runs first in onnxruntime's DEFAULT order."""
    vi = helper.make_tensor_value_info
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu_a"),
        helper.make_node("Dropout", ["a", "p", "train"], ["da", "ma"], name="drop_a"),
        helper.make_node("Neg", ["x"], ["b"], name="neg_b"),
        helper.make_node("Dropout", ["b", "p", "train"], ["db", "mb"], name="drop_b"),
        helper.make_node("Add", ["da", "db"], ["y"], name="add"),
    ]
    inits = [
        helper.make_tensor("p", TensorProto.FLOAT, [], [0.5]),
        helper.make_tensor("train", TensorProto.BOOL, [], [True]),
    ]
    graph = helper.make_graph(
        nodes,
        "siblings",
        [vi("x", TensorProto.FLOAT, [32, 32])],
        [vi("y", TensorProto.FLOAT, [32, 32])] + [vi(m, TensorProto.BOOL, [32, 32]) for m in ("ma", "mb")],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _is_topological(model: onnx.ModelProto) -> bool:
    made = {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer}
    for n in model.graph.node:
        if any(t and t not in made for t in n.input):
            return False
        made.update(n.output)
    return True


def test_flipped_pairs_names_only_consecutive_pairs_run_the_other_way():
    assert flipped_pairs(["a", "b", "c"], ["a", "b", "c"]) == []
    assert flipped_pairs(["a", "b", "c"], ["b", "a", "c"]) == [("a", "b")]
    assert flipped_pairs(["a", "b", "c"], ["c", "a", "b"]) == [("b", "c")]
    assert flipped_pairs(["a", "x", "b"], ["b", "a"]) == [("a", "b")]  # names not run are skipped


def test_sibling_random_ops_run_in_another_order_than_the_node_list():
    model = _siblings()
    emu = emulate(model, TensorSizes(model))
    assert [n.name for n in random_ops(model)] == ["drop_a", "drop_b"]
    assert emu.random_order() == ["drop_b", "drop_a"]  # the premise of the GPT-NeoX failure


@pytest.mark.parametrize("order", [["drop_a", "drop_b"], ["drop_b", "drop_a"]])
def test_pins_keep_the_node_list_topological_for_either_order(order):
    """A pin is placed right before its random op and the list sorted stably: whichever branch has
    to wait, every node still comes after what it reads (the old pins did not sort)."""
    model = _siblings()
    pinned, pins = pin_random_order(model, order)
    assert len(pins) == 1 and pins[0] == tags.pin_name(order[1])
    assert _is_topological(pinned)
    assert emulate(pinned, TensorSizes(pinned)).random_order() == order
    assert _is_topological(model) and len(model.graph.node) == 5  # the input is not changed


def test_keep_random_order_pins_nothing_when_the_order_is_kept():
    model = _siblings()
    emu = emulate(model, TensorSizes(model))
    same, pins = keep_random_order(emu, ["drop_b", "drop_a"])  # the order it runs in already
    assert same is emu and pins == []
    changed, pins = keep_random_order(emu, ["drop_a", "drop_b"])
    assert pins == [tags.pin_name("drop_b")]
    assert changed.random_order() == ["drop_a", "drop_b"] and _is_topological(changed.model)


def test_pins_only_the_pairs_asked_for():
    model = _siblings()
    pinned, pins = pin_random_order(model, ["drop_a", "drop_b"], pairs=[])
    assert pins == [] and pinned is model


# -- against onnxruntime: every arrangement, bit-identical -------------------------------------

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

import onnx_remat
from onnx_remat.runtime.compare import compare


@pytest.fixture(scope="module")
def parallel(tmp_path_factory):
    from regressions import ParallelNet, make_artifacts

    torch.manual_seed(0)
    return make_artifacts(ParallelNet(), torch.randn(4, 16, 64), tmp_path_factory.mktemp("parallel"))


@pytest.fixture(scope="module")
def drop_residual(tmp_path_factory):
    from regressions import DropResidualNet, make_artifacts

    torch.manual_seed(0)
    return make_artifacts(DropResidualNet(), torch.randn(8, 64), tmp_path_factory.mktemp("dropres"))


def _exact(src, result, out):
    c = compare(src, result.save(out), steps=1, live=False)
    assert c.equal, (c.mismatched[:5], c.equality_run)
    assert _is_topological(result.model)
    return c


@pytest.mark.parametrize(
    "options",
    [
        {},  # parallel branches, each with random ops; scheduled, packed masks
        {"schedule": False},
        {"schedule": False, "dropout": "byte"},
    ],
    ids=["scheduled", "unscheduled", "unscheduled-byte"],
)
def test_parallel_residual_blocks_recompute_bit_identically(parallel, tmp_path, options):
    result = onnx_remat.apply(parallel, scopes="blocks.*", **options)
    assert len(result.rewrite.segments) == 3
    _exact(parallel, result, tmp_path / "remat")


def test_random_ops_outside_the_selection_keep_their_order(parallel, tmp_path):
    """Only the MLP branches are recomputed: the attention branches' dropouts are not selected."""
    result = onnx_remat.apply(parallel, scopes="blocks.*.mlp", schedule=False)
    _exact(parallel, result, tmp_path / "remat")


def test_random_ops_in_both_branches_of_a_residual(drop_residual, tmp_path):
    result = onnx_remat.apply(drop_residual, scopes="blocks.*")
    _exact(drop_residual, result, tmp_path / "remat")


def test_a_selection_that_touches_no_random_op_adds_no_pin(parallel, tmp_path):
    result = onnx_remat.apply(parallel, op_types="Gelu", schedule=False)
    assert result.rewrite.random_order_pins == []
    assert not any(tags.is_pin_name(n.name) for n in result.model.graph.node)
    _exact(parallel, result, tmp_path / "remat")
