"""How many graphs one command emulates: each emulation is the costliest step of a command (README
"Scale"), so the count per command is pinned here, and a change that emulates the same graph
twice fails.

An emulation is counted where its :class:`~onnx_remat.ortsim.graph.RuntimeGraph` is made. Today:
``apply`` emulates the original, the rewrite, the rewrite with its partial gradients accumulated
in place (when the graph has shared parameters) and the best order found, written and checked (a
second order only where it is predicted lower than the first one's verified peak);
``estimate`` the same (it is ``apply`` without writing); ``schedule`` the original, the
accumulated variant and the order checked. ``apply --budget`` emulates the original once and each
plan it checks once (its rewrite, ordered), and the chosen plan's schedule starts from the
emulation the plan's check made where that is the one kept (the cheapest fitting plan's).
"""

from __future__ import annotations

import pytest
from conftest import artifacts_dir

import onnx_remat
from onnx_remat.estimate import estimate


@pytest.mark.parametrize(
    ("name", "scope", "most"),
    [("gpt", "Block", {"apply": 3, "estimate": 3, "schedule": 1}), ("fc5", "FCBlock", {"apply": 2, "estimate": 2})],
)
def test_each_command_emulates_each_graph_once(emulations, name, scope, most):
    art = artifacts_dir(name)
    runs = {
        "apply": lambda: onnx_remat.apply(art, scopes=scope),
        "estimate": lambda: estimate(art, scopes=scope),
        "schedule": lambda: onnx_remat.schedule(art),
    }
    for command, limit in most.items():
        emulations[0] = 0
        runs[command]()
        assert 1 <= emulations[0] <= limit, (
            f"{name} {command}: {emulations[0]} graphs emulated, at most {limit} expected"
        )


@pytest.mark.parametrize(("name", "most"), [("blocks10", {"50%": 5, "min": 18}), ("gpt", {"50%": 7, "min": 12})])
def test_a_budget_emulates_each_plan_once(emulations, name, most):
    """One more each before the chosen plan's schedule started from its check's emulation."""
    for budget, limit in most.items():
        emulations[0] = 0
        onnx_remat.apply(artifacts_dir(name), budget=budget)
        assert 1 <= emulations[0] <= limit, (
            f"{name} --budget {budget}: {emulations[0]} graphs emulated, at most {limit}"
        )


def test_apply_infers_the_graph_once(monkeypatch):
    """onnx's whole-graph shape inference runs once per ``apply``: the load check's (strict) typed
    skeleton gives the analysis its sizes (``TensorSizes(inferred=...)``), and the rewrite's sizes
    are updated from the original's emulation (``rewrite_sizes``), not inferred again."""
    import onnx

    inferred = [0]
    infer_shapes = onnx.shape_inference.infer_shapes

    def counted(*args, **kwargs):
        inferred[0] += 1
        return infer_shapes(*args, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", counted)
    onnx_remat.apply(artifacts_dir("gpt"), scopes="Block")
    assert inferred[0] == 1


def test_same_attrs_compares_model_nodes_without_reading_them():
    """``RuntimeNode.same_attrs``, as the adopted-plan comparison uses it: two nodes still holding
    their model nodes are compared as protos (their attributes are not read into dicts), and
    otherwise by value, as ``attrs ==`` would."""
    import onnx

    from onnx_remat.ortsim.graph import RuntimeNode

    def node(perm, name="t"):
        proto = onnx.helper.make_node("Transpose", ["x"], ["y"], name=name, perm=perm)
        return RuntimeNode(0, name, "Transpose", "", ["x"], ["y"], proto, (name,))

    a, b, c = node([1, 0]), node([1, 0], name="other"), node([0, 1])
    assert a.same_attrs(b)
    assert isinstance(a._attrs, onnx.NodeProto) and isinstance(b._attrs, onnx.NodeProto)  # not read
    assert not a.same_attrs(c)  # protos that differ: compared by value
    assert b.attrs == {"perm": [1, 0]}  # read now: a dict on one side, a proto on the other
    assert a.same_attrs(b) and b.same_attrs(a) and not b.same_attrs(c)


def test_the_input_is_emulated_once_where_the_plan_asks_which_transposes_move(monkeypatch, tmp_path):
    """blocks10's Transposes read into ops onnxruntime pushes them through: its plans ask which it
    moves (ModelAnalysis.moved_transposes), which the input's emulation answers. That emulation is
    the one the command takes afterwards, in this process or in a forked child (a large graph:
    apply's child that estimates the input, the budget planner's reference plan made before its
    set-up takes the emulation): made once in all, in the command and its children."""
    from onnx_remat import forked
    from onnx_remat.analysis import model as analysis_model
    from onnx_remat.analysis.model import analyze_model
    from onnx_remat.remat.budget import BudgetPlanner

    log = tmp_path / "emulated"  # a line per emulation of the input, from any process
    emulate = analysis_model.ModelAnalysis._emulate

    def counted(self):
        with log.open("a") as f:
            f.write("x\n")
        return emulate(self)

    def made() -> int:
        count = len(log.read_text().splitlines()) if log.exists() else 0
        log.unlink(missing_ok=True)
        return count

    monkeypatch.setattr(analysis_model.ModelAnalysis, "_emulate", counted)
    for large in (False, True):
        with monkeypatch.context() as patch:
            if large:
                patch.setattr(forked, "FORK_MIN_NODES", 0)
            analysis = analyze_model(artifacts_dir("blocks10"))
            planner = BudgetPlanner(analysis)
            assert made() == 1 and analysis._moved, large  # it moves some: the plan asked
            assert planner.baseline.planned_peak_bytes > 0
            result = onnx_remat.apply(artifacts_dir("blocks10"), scopes="Block")
            assert made() == 1, large
            assert result.estimate_before is not None
            assert result.analysis._emulation is None  # not held once taken, or once the child took it
