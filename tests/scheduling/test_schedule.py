"""The memory schedule: its orders, their realization in the node list, and the pass's guarantees."""

from __future__ import annotations

import onnx
import pytest
from conftest import artifacts_dir
from onnx import TensorProto, helper

import onnx_remat
from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.estimate import estimate_rewritten
from onnx_remat.graph.random_order import pin_random_order, random_ops
from onnx_remat.model_io import load_model
from onnx_remat.ortsim.emulation import emulate
from onnx_remat.ortsim.graph import node_io, runtime_graph
from onnx_remat.ortsim.optimizer import optimize
from onnx_remat.ortsim.shapes import infer_runtime_shapes
from onnx_remat.scheduling.orders import POLICIES, leaf_ranked_order, leaves, list_schedule
from onnx_remat.scheduling.realize import LeafPlacer, model_leaves, place_leaves
from onnx_remat.scheduling.schedule import MemorySchedule

EXAMPLES = ["blocks10", "fc5", "gpt", "resnet"]


def _graph(name):
    model = load_model(artifacts_dir(name)).model
    sizes = TensorSizes(model)
    infer_runtime_shapes(model, sizes)
    return model, sizes, emulate(model, sizes, shapes_known=True)


def _is_topological(rg, order):
    seen: set[int] = set()
    for i in order:
        if any(p not in seen for p in rg.producers_of(rg.at(i))):
            return False
        seen.add(i)
    return len(seen) == len(rg.live())


@pytest.mark.parametrize("policy", POLICIES)
def test_list_schedules_are_topological_orders(policy):
    _, _, g = _graph("gpt")
    order = list_schedule(g.rg, g.order, policy)
    assert _is_topological(g.rg, order)
    if policy == "default":
        assert order == g.order  # the current order, unchanged


def test_freeing_runs_weight_gradients_as_soon_as_they_free_memory():
    """A node that frees as much as it allocates runs as soon as it can: x -> big -> small, and a
    reader of x that frees nothing waits (it is the last in file order either way)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 256])
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="a"),  # 256 KiB
        helper.make_node("ReduceSum", ["a"], ["s"], name="s", keepdims=1),  # frees a
        helper.make_node("Neg", ["x"], ["b"], name="b"),  # another 256 KiB
        helper.make_node("Add", ["b", "s"], ["y"], name="y"),
    ]
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 256])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    sizes = TensorSizes(model)
    infer_runtime_shapes(model, sizes)
    rg = optimize(runtime_graph(model, sizes))
    base = [rg.producer[t] for t in ("a", "b", "s", "y")]  # b before s: a and b alive together
    names = {p: [rg.at(i).name for i in list_schedule(rg, base, p)] for p in POLICIES}
    assert names["default"] == ["a", "b", "s", "y"]
    assert names["freeing"] == names["greedy"] == ["a", "s", "b", "y"]


@pytest.mark.parametrize("name", ["blocks10", "gpt"])
def test_leaf_ranks_predict_what_onnxruntime_runs_once_written(name):
    """leaf_ranked_order is the DEFAULT order of the graph place_leaves writes (emulated again)."""
    model, sizes, g = _graph(name)
    ends = set(leaves(g.rg))
    for policy in POLICIES:
        target = list_schedule(g.rg, g.order, policy)
        rank = {i: k for k, i in enumerate(target) if i in ends}
        predicted = [g.rg.at(i).name for i in leaf_ranked_order(g.rg, g.first_added, rank)]
        written = place_leaves(model, {n: float(k) for i, k in rank.items() for n in g.rg.at(i).origin})
        again = emulate(written, sizes, shapes_known=True)
        assert predicted == [again.rg.at(i).name for i in again.order], policy


@pytest.mark.parametrize("name", EXAMPLES)
def test_a_written_graph_read_from_its_emulated_source_is_the_graph_read_again(name):
    """LeafPlacer given the emulation's node lists (Emulation.io) finds the same leaves, and the
    graph it writes, emulated from the lists and the source nodes it gives, is the graph emulated
    from its own nodes."""
    model, _, g = _graph(name)
    placer, plain = LeafPlacer(model, g.io), LeafPlacer(model)
    assert placer.movable == plain.movable == [k for k in model_leaves(model) if model.graph.node[k].name]
    ends = set(leaves(g.rg))
    rank = {i: k for k, i in enumerate(list_schedule(g.rg, g.order, POLICIES[-1])) if i in ends}
    positions = placer.positions({n: float(k) for i, k in rank.items() for n in g.rg.at(i).origin})
    written = placer.write(positions)
    assert placer.io(positions) == node_io(written) and plain.io(positions) is None
    assert placer.protos(positions) == list(written.graph.node)  # equal, not the same objects
    shared = emulate(written, g.sizes, shapes_known=True, io=placer.io(positions), protos=placer.protos(positions))
    again = emulate(written, g.sizes, shapes_known=True)
    assert shared.order == again.order and shared.planned_peak_bytes == again.planned_peak_bytes
    assert [(n.name, n.inputs, n.outputs) for n in shared.rg.live()] == [
        (n.name, n.inputs, n.outputs) for n in again.rg.live()
    ]
    assert g.io == node_io(model)  # neither emulation changed the lists they share with g


def test_place_leaves_moves_only_leaves():
    model = load_model(artifacts_dir("fc5")).model
    ends = [model.graph.node[k].name for k in model_leaves(model)]
    rank = {n: float(k) for k, n in enumerate(ends)}
    written = place_leaves(model, rank)
    names = [n.name for n in written.graph.node]
    assert names[-len(ends) :] == list(reversed(ends))  # the lowest rank last: its cone runs first
    assert [n for n in names if n not in rank] == [n.name for n in model.graph.node if n.name not in rank]
    assert len(model.graph.node) == len(written.graph.node) and model.graph.node[-1].name != names[-1]


def _two_dropouts():
    """Two independent Dropouts (as a BART's encoder and decoder embedding dropouts are)."""
    vi = helper.make_tensor_value_info
    nodes = [
        helper.make_node("Dropout", ["x", "p", "train"], ["dx", "mx"], name="drop_x"),
        helper.make_node("Dropout", ["z", "p", "train"], ["dz", "mz"], name="drop_z"),
        helper.make_node("Add", ["dx", "dz"], ["y"], name="add"),
    ]
    inits = [
        helper.make_tensor("p", TensorProto.FLOAT, [], [0.5]),
        helper.make_tensor("train", TensorProto.BOOL, [], [True]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [vi("x", TensorProto.FLOAT, [64, 64]), vi("z", TensorProto.FLOAT, [64, 64])],
        [
            vi("y", TensorProto.FLOAT, [64, 64]),
            vi("mx", TensorProto.BOOL, [64, 64]),
            vi("mz", TensorProto.BOOL, [64, 64]),
        ],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _random_run_order(model):
    sizes = TensorSizes(model)
    infer_runtime_shapes(model, sizes)
    g = emulate(model, sizes, shapes_known=True)
    randoms = {n.name for n in random_ops(model)}
    return [n for i in g.order for n in g.rg.at(i).origin if n in randoms]


def test_pins_keep_random_ops_in_the_given_order():
    model = _two_dropouts()
    assert _random_run_order(model) == ["drop_z", "drop_x"]  # DEFAULT order: higher index first
    pinned, pins = pin_random_order(model, ["drop_x", "drop_z"])
    assert pins == ["remat_order/drop_z"]
    assert _random_run_order(pinned) == ["drop_x", "drop_z"]
    pin = next(n for n in pinned.graph.node if n.name == pins[0])
    assert pin.op_type == "PassThrough" and list(pin.input) == ["z", "mx"]  # waits for drop_x's mask
    assert pin_random_order(pinned, ["drop_x", "drop_z"])[1] == []  # pinned already
    # an order the data forbids (blocks10's dropouts form one chain) is refused, not half-written
    chain = load_model(artifacts_dir("blocks10")).model
    names = [n.name for n in random_ops(chain)]
    with pytest.raises(RuntimeError, match="cycle"):
        pin_random_order(chain, list(reversed(names)))


@pytest.mark.parametrize("name", EXAMPLES)
def test_schedule_never_raises_the_peak_and_reports_the_written_graphs_estimate(name):
    analysis = onnx_remat.analyze_model(artifacts_dir(name))
    source = analysis.model.SerializeToString()
    result = onnx_remat.schedule(analysis)
    assert analysis.model.SerializeToString() == source  # the input is not changed
    before, after = result.estimate_before.planned_peak_bytes, result.estimate_after.planned_peak_bytes
    assert after <= before
    assert result.schedule.planned_peak_after == after == estimate_rewritten(analysis, result.model).planned_peak_bytes
    if not result.schedule.changed:
        assert result.model is analysis.model
    assert not any(n.name.endswith("/remat") for n in result.model.graph.node)  # nothing recomputed
    # forward random ops draw in the original order
    randoms = {n.name for n in random_ops(analysis.model)}
    assert [n for n in result.estimate_after.order_names if n in randoms] == [
        n for n in result.estimate_before.order_names if n in randoms
    ]


def test_schedule_lowers_blocks10_and_apply_schedules_its_rewrite():
    result = onnx_remat.schedule(artifacts_dir("blocks10"))
    assert (
        result.schedule.changed and result.estimate_after.planned_peak_bytes < result.estimate_before.planned_peak_bytes
    )
    plain = onnx_remat.apply(artifacts_dir("blocks10"), scopes="Block", schedule=False)
    scheduled = onnx_remat.apply(artifacts_dir("blocks10"), scopes="Block")
    assert plain.schedule is None and scheduled.schedule is not None
    assert scheduled.estimate_after.planned_peak_bytes < plain.estimate_after.planned_peak_bytes
    assert scheduled.model is scheduled.schedule.model
    assert scheduled.summary()["schedule"]["chosen"]["policy"] in POLICIES
    # apply lets the rewrite's emulation go once estimated (a quarter of a GiB at 10^5 nodes, under
    # the output check's peak); the schedule command's result keeps its own
    assert scheduled.schedule.emulation is None and scheduled.estimate_after is not None
    assert result.schedule.emulation is not None


def test_schedule_result_summary_and_save(tmp_path):
    result = onnx_remat.schedule(artifacts_dir("fc5"))
    summary = result.summary()
    assert summary["planned_peak_bytes_after"] <= summary["planned_peak_bytes_before"]
    assert {c["policy"] for c in summary["candidates"]} == set(POLICIES)
    out = result.save(tmp_path / "fc5_scheduled")
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoint",
        "eval_model.onnx",
        "optimizer_model.onnx",
        "training_model.onnx",
    ]
    assert len(onnx.load(out / "training_model.onnx").graph.node) == len(result.model.graph.node)
    assert result.default_output().name == "fc5_scheduled"


def test_schedule_makes_the_graph_and_the_estimates_only_when_asked_for():
    """The command prints the planned peaks alone: the graphsurgeon graph, the regions, the scopes
    and the whole estimates are made when a caller asks, and are then what they were made at once."""
    from onnx_remat.estimate import estimate_original

    result = onnx_remat.schedule(artifacts_dir("blocks10"))
    summary = result.summary()
    assert result.analysis._training is None and "estimate_before" not in vars(result)
    eager = onnx_remat.analyze_model(artifacts_dir("blocks10"))
    before = estimate_original(eager)
    after = estimate_rewritten(eager, result.model)
    assert summary["planned_peak_bytes_before"] == result.planned_peak_before == before.planned_peak_bytes
    assert summary["planned_peak_bytes_after"] == result.planned_peak_after == after.planned_peak_bytes
    assert result.estimate_before.to_json() == before.to_json()
    assert result.estimate_after.to_json() == after.to_json()
    assert result.estimate_after is result.estimate_after  # made once
    assert result.analysis._training is not None


def test_unknown_accumulation_mode_is_a_user_error():
    with pytest.raises(onnx_remat.RematError, match="gradient accumulation must be one of"):
        onnx_remat.schedule(artifacts_dir("fc5"), grad_accumulation="sometimes")
    with pytest.raises(ValueError):
        MemorySchedule(grad_accumulation="sometimes")


def test_an_order_predicted_no_lower_than_a_verified_peak_is_not_written(emulations):
    """blocks10_dynamo: freeing and greedy predict the same peak. The first is written and emulated
    again (its planned peak is its prediction); the second could only win by planning below its
    own prediction, so it is not written: one emulation of the written graphs, not two."""
    result = onnx_remat.schedule(artifacts_dir("blocks10_dynamo"))
    promising = [
        c for c in result.schedule.candidates if c.predicted_peak_bytes < result.estimate_before.planned_peak_bytes
    ]
    assert len(promising) >= 2 and promising[0].predicted_peak_bytes == promising[1].predicted_peak_bytes
    assert promising[0].planned_peak_bytes == promising[0].predicted_peak_bytes
    assert promising[1].planned_peak_bytes is None
    assert result.schedule.chosen is promising[0]
    assert emulations[0] == 2  # the given graph and the one order written


class _Verdict:
    """A stand-in for a check's verdict that records what became of it."""

    def __init__(self) -> None:
        self.cancelled = False

    def result(self) -> bool:
        return True

    def cancel(self) -> None:
        self.cancelled = True


def _node_multiset(model: onnx.ModelProto) -> list[bytes]:
    return sorted(n.SerializeToString(deterministic=True) for n in model.graph.node)


def test_a_graph_written_by_moving_leaves_is_judged_by_the_check_of_the_graph_it_moves():
    """The schedule of blocks10 moves leaves only: the graph written is the given graph's nodes in
    another topological order, so the verdict on the given graph is handed on as its own, and no
    check of its own is started."""
    from onnx_remat.ortsim.registry import check_runtime_support

    model, sizes, _ = _graph("blocks10")
    verdict = _Verdict()
    schedule = MemorySchedule(check_ahead=True)
    started: list[onnx.ModelProto] = []
    schedule._check_ahead = lambda written: started.append(written)  # type: ignore[method-assign]
    result = schedule(model, sizes, model_check=verdict)
    assert result.changed and result.chosen.graph == "as given" and not result.pins
    assert result.checking is verdict and not verdict.cancelled and not started
    # what the verdict stands for: the same nodes, in an order onnx's checker takes as sorted
    assert result.model is not model and _node_multiset(result.model) == _node_multiset(model)
    check_runtime_support(result.model, "scheduled")


def test_the_given_graphs_check_is_cancelled_where_the_schedule_writes_another_graph():
    """Where the graph given is pinned first (its random ops ran out of order), or has subgraphs
    (whose nodes may read a moved leaf's outputs), the verdict does not carry over."""
    model = _two_dropouts()
    assert _random_run_order(model) == ["drop_z", "drop_x"]
    verdict = _Verdict()
    result = MemorySchedule()(model, TensorSizes(model), random_order=["drop_x", "drop_z"], model_check=verdict)
    assert result.pins and verdict.cancelled and result.checking is None

    assert LeafPlacer(model).sorted_as_given
    body = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "body", [], [])
    with_if = onnx.ModelProto()
    with_if.CopyFrom(model)
    with_if.graph.node.add().CopyFrom(
        helper.make_node("If", ["cond"], ["out"], name="branch", then_branch=body, else_branch=body)
    )
    assert not LeafPlacer(with_if).sorted_as_given


def test_apply_checks_the_rewrite_once_beside_its_emulation(monkeypatch):
    """On a large graph apply starts the output's check on the rewrite before the schedule
    emulates it; the schedule's graph moves leaves only, so that check is the written graph's: one
    check process, nothing checked in the command, and the same bytes written."""
    from onnx_remat import forked
    from onnx_remat.ortsim.check_process import CheckProcess
    from onnx_remat.scheduling import schedule as schedule_module

    here = onnx_remat.apply(artifacts_dir("blocks10"), scopes="Block")
    started: list[onnx.ModelProto] = []
    checked: list[str] = []
    start = CheckProcess.start.__func__  # type: ignore[attr-defined]

    def tracked_start(cls, model, path=None):
        started.append(model)
        return start(cls, model, path)

    check = schedule_module.check_runtime_support

    def tracked_check(model, where="model", **kwargs):
        checked.append(where)
        return check(model, where, **kwargs)

    monkeypatch.setattr(CheckProcess, "start", classmethod(tracked_start))
    monkeypatch.setattr(schedule_module, "check_runtime_support", tracked_check)
    monkeypatch.setattr(forked, "FORK_MIN_NODES", 0)
    beside = onnx_remat.apply(artifacts_dir("blocks10"), scopes="Block")
    assert len(started) == 1 and not checked
    assert beside.schedule is not None and beside.schedule.chosen.graph == "as given"
    assert _node_multiset(started[0]) == _node_multiset(beside.model)
    assert beside.model.SerializeToString() == here.model.SerializeToString()


@pytest.mark.parametrize("name", EXAMPLES)
def test_a_ranking_that_keeps_the_leaves_order_predicts_the_current_order(name):
    """What LeafOrders returns without a walk when given the current order (the DEFAULT policy's
    ranking keeps the leaves in their list order) is what the walk gives."""
    from onnx_remat.scheduling.orders import LeafOrders

    _, _, g = _graph(name)
    walked = LeafOrders(g.rg, g.first_added)
    rank = {i: k for k, i in enumerate(g.order) if i in set(walked.leaves)}
    assert walked.order(rank) == g.order
    known = LeafOrders(g.rg, g.first_added, g.order)
    assert known.order(rank) == g.order and known.order(rank) is not g.order
    reversed_rank = {i: -k for i, k in rank.items()}
    assert known.order(reversed_rank) == walked.order(reversed_rank)


@pytest.mark.parametrize("name", ["blocks10", "gpt"])
def test_predictions_made_beside_are_the_sequential_ones(name, monkeypatch):
    """On a large graph the last policy and the emulation's own plan are predicted in forked
    children: the orders and planned peaks are those predicted in one process, the own plan's peak
    is known without its plan being made here, and the schedule it leads to is the same."""
    from onnx_remat import forked
    from onnx_remat.scheduling.schedule import _predictions

    model, sizes, sequential_g = _graph(name)
    sequential = _predictions(sequential_g, POLICIES)
    here = MemorySchedule()(model, sizes)
    monkeypatch.setattr(forked, "FORK_MIN_NODES", 0)
    _, _, g = _graph(name)
    beside = _predictions(g, POLICIES)
    assert [(p, rank, order, plan.planned_peak_bytes) for p, rank, order, plan in beside] == [
        (p, rank, order, plan.planned_peak_bytes) for p, rank, order, plan in sequential
    ]
    assert not g.planned and g.planned_peak_bytes == sequential_g.planned_peak_bytes
    assert g.plan.planned_peak_bytes == g.planned_peak_bytes  # made when asked for
    assert MemorySchedule()(model, sizes).summary() == here.summary()


@pytest.mark.parametrize("name", ["blocks10", "blocks10_dynamo", "fc5"])
def test_a_written_graph_checked_beside_stands_in_for_its_emulation(name, monkeypatch):
    """Where the predictions are made beside, the graph written for the lowest prediction made here
    is emulated in a forked child meanwhile; running exactly the predicted steps, it is not emulated
    again here: its emulation is the predicted one (a stand-in), whose estimate is the written
    graph's own emulation's, figure for figure and name for name. A stand-in given to the schedule
    again is emulated afresh (its node indices are another node list's)."""
    from onnx_remat import forked
    from onnx_remat.memory import memory_estimate

    model, sizes, _ = _graph(name)
    here = MemorySchedule()(model, sizes)
    monkeypatch.setattr(forked, "FORK_MIN_NODES", 0)
    beside = MemorySchedule()(model, sizes)
    assert beside.summary() == here.summary()
    assert beside.model.SerializeToString() == here.model.SerializeToString()
    assert beside.changed and beside.emulation is not None and beside.emulation.stands_in
    assert here.emulation is not None and not here.emulation.stands_in
    assert memory_estimate(beside.emulation).to_json() == memory_estimate(here.emulation).to_json()
    # what the child checks: the written graph, emulated from scratch, runs the predicted steps
    from onnx_remat.scheduling.realize import LeafPlacer
    from onnx_remat.scheduling.schedule import _leaf_ranks, _predictions, _runs_as_predicted

    _, _, g = _graph(name)
    reordered = [(rank, predicted) for _, rank, predicted, _ in _predictions(g, POLICIES) if predicted != g.order]
    assert reordered
    placer = LeafPlacer(g.model, g.io)
    for rank, predicted in reordered:
        ranks = _leaf_ranks(g, rank)
        assert _runs_as_predicted(g, placer, ranks, predicted) == list(beside.emulation.rg.initializers)
        assert _runs_as_predicted(g, placer, ranks, list(reversed(predicted))) is None
        # the child emulates the node list without writing the graph: as the written graph emulates
        positions = placer.positions(ranks)
        written = emulate(placer.write(positions), g.sizes.copy(), shapes_known=True)
        listed = emulate(
            g.model, g.sizes.copy(), shapes_known=True, io=placer.io(positions), protos=placer.protos(positions)
        )
        unread = emulate(
            g.model,
            g.sizes.copy(),
            shapes_known=True,
            protos=placer.protos(positions),
            io=([p.input[:] for p in placer.protos(positions)], [p.output[:] for p in placer.protos(positions)]),
        )
        for other in (listed, unread):
            assert [(n.name, n.op, n.inputs, n.outputs) for n in map(other.rg.at, other.order)] == [
                (n.name, n.op, n.inputs, n.outputs) for n in map(written.rg.at, written.order)
            ]
            assert list(other.rg.initializers) == list(written.rg.initializers)
            assert other.rg.rewrites == written.rg.rewrites
    again = MemorySchedule()(beside.emulation)
    assert again.planned_peak_before == here.planned_peak_after
    assert again.summary() == MemorySchedule()(here.emulation).summary()
