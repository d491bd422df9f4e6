"""The memory schedule predicts each order on one emulated graph, then emulates the graph it writes
from scratch; where that graph runs exactly the predicted steps, it takes the predicted plan
(Emulation.adopt_plan) instead of planning again. The adopted plan must be the plan onnx-remat
would have made, field for field, and a graph that runs anything else must not take it."""

from __future__ import annotations

import dataclasses

from conftest import artifacts_dir

from onnx_remat.analysis.model import analyze_model
from onnx_remat.ortsim.emulation import emulate
from onnx_remat.ortsim.planner import plan_memory
from onnx_remat.scheduling.orders import POLICIES, leaf_ranked_order, leaves, list_schedule
from onnx_remat.scheduling.realize import place_leaves


def _predicted_and_written(name: str, policy: str):
    analysis = analyze_model(artifacts_dir(name))
    g = emulate(analysis.model, analysis.sizes)
    ends = set(leaves(g.rg))
    rank = {i: k for k, i in enumerate(list_schedule(g.rg, g.order, policy)) if i in ends}
    predicted = leaf_ranked_order(g.rg, g.first_added, rank)
    ranks = {name: float(k) for i, k in rank.items() for name in g.rg.at(i).origin}
    written = emulate(place_leaves(g.model, ranks), g.sizes, shapes_known=True)
    return g, predicted, written


def test_an_adopted_plan_is_the_plan_made_from_scratch():
    for name in ("blocks10", "gpt", "resnet"):
        for policy in POLICIES:
            g, predicted, written = _predicted_and_written(name, policy)
            fresh = plan_memory(written.rg, written.order)
            assert written.adopt_plan(g.rg, predicted, plan_memory(g.rg, predicted)), (name, policy)
            assert dataclasses.asdict(written.plan) == dataclasses.asdict(fresh)
            assert list(written.plan.tensors) == list(fresh.tensors)  # the order live tensors are listed in


def test_a_graph_that_runs_anything_else_keeps_its_own_plan():
    g, predicted, written = _predicted_and_written("gpt", POLICIES[0])
    plan = plan_memory(g.rg, predicted)
    swapped = list(predicted)
    k = next(k for k in range(len(swapped) - 1) if g.rg.at(swapped[k]).op != g.rg.at(swapped[k + 1]).op)
    swapped[k], swapped[k + 1] = swapped[k + 1], swapped[k]
    assert not written.adopt_plan(g.rg, swapped, plan)
    assert not written.adopt_plan(g.rg, predicted[:-1], plan)
    other = analyze_model(artifacts_dir("gpt"))  # the same graph with sizes of its own: not taken on trust
    assert not written.adopt_plan(emulate(other.model, other.sizes).rg, predicted, plan)
    assert written.planned_peak_bytes == plan_memory(written.rg, written.order).planned_peak_bytes
