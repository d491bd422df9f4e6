"""The memory planner reads what every plan of one graph reads whatever the order (use counts, shape
keys) once per graph (planner._PlanTables): every plan made with those tables is the plan made
without them, field for field, for any order; the tables are read again once the graph changes, and
an order of part of the graph counts its own uses. These are the Python planner's tables: the
compiled walk (tests/ortsim/test_plan_arrays.py) is turned off here."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from conftest import artifacts_dir

from onnx_remat.analysis.model import analyze_model
from onnx_remat.ortsim import planner
from onnx_remat.ortsim.emulation import emulate
from onnx_remat.ortsim.planner import plan_memory, prepare_plans
from onnx_remat.scheduling.orders import POLICIES, list_schedule


@pytest.fixture(autouse=True)
def python_planner(monkeypatch):
    monkeypatch.setenv("ONNX_REMAT_NATIVE", "0")


def _fresh(rg, order):
    """The plan made with the tables read anew, on a copy of the graph."""
    other = copy.copy(rg)
    other.plan_tables = None
    return plan_memory(other, order)


@pytest.mark.parametrize("name", ["blocks10", "gpt", "resnet"])
def test_plans_made_with_the_graphs_tables_are_plans_made_anew(name):
    analysis = analyze_model(artifacts_dir(name))
    g = emulate(analysis.model, analysis.sizes)
    prepare_plans(g.rg)
    tables = g.rg.plan_tables
    assert isinstance(tables, planner._PlanTables)
    orders = [g.order] + [list_schedule(g.rg, g.order, policy) for policy in POLICIES]
    for order in orders:
        made = plan_memory(g.rg, order)
        assert g.rg.plan_tables is tables  # read once for the graph, not per plan
        fresh = _fresh(g.rg, order)
        assert dataclasses.asdict(made) == dataclasses.asdict(fresh)
        assert list(made.tensors) == list(fresh.tensors)
    # the tables' counts are the graph's: a plan counts down a copy of them
    assert tables.use == planner._use_counts(g.rg, g.rg.live())


def test_the_tables_follow_the_graph():
    analysis = analyze_model(artifacts_dir("blocks10"))
    g = emulate(analysis.model, analysis.sizes)
    plan_memory(g.rg, g.order)
    first = g.rg.plan_tables
    g.rg.edits += 1  # any edit: read again
    plan_memory(g.rg, g.order)
    assert g.rg.plan_tables is not first
    # an order of part of the graph (its first half) counts its own uses: planned as the graph made
    # of those nodes alone is (whose tables are theirs)
    part = g.order[: len(g.order) // 2]
    made = plan_memory(g.rg, part)
    assert g.rg.plan_tables.live == len(g.order) != len(part)
    keep = set(part)
    alone = copy.copy(g.rg)
    alone.nodes = [n if n is not None and n.index in keep else None for n in g.rg.nodes]
    alone.plan_tables = None
    assert dataclasses.asdict(plan_memory(alone, part)) == dataclasses.asdict(made)
    assert alone.plan_tables.live == len(part)
