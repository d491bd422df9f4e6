"""MemoryPlanner, which keeps a graph's use counts and reuse keys across orders, plans every order
exactly as plan_memory does: orders of all nodes, and orders it must not reuse counts for."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import artifacts_dir

from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.model_io import load_model
from onnx_remat.ortsim.emulation import emulate
from onnx_remat.ortsim.planner import MemoryPlanner, plan_memory
from onnx_remat.ortsim.shapes import infer_runtime_shapes
from onnx_remat.scheduling.orders import POLICIES, list_schedule


def _fields(plan):
    data = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if f.name != "tensors"}
    data["tensors"] = [dataclasses.astuple(t) for t in plan.tensors.values()]
    return data


@pytest.mark.parametrize("name", ["blocks10", "gpt", "resnet"])
def test_memory_planner_plans_as_plan_memory(name):
    model = load_model(artifacts_dir(name)).model
    sizes = TensorSizes(model)
    infer_runtime_shapes(model, sizes)
    g = emulate(model, sizes, shapes_known=True)
    base = list(g.order)
    orders = [list_schedule(g.rg, base, p) for p in POLICIES]
    orders += [
        base[: len(base) // 2],  # some nodes missing
        base + [base[len(base) // 3]],  # a node twice
        base[:-1] + [base[0]],  # one missing, another twice: as many entries as nodes
        list(reversed(base)),  # not topological
    ]
    planner = MemoryPlanner(g.rg)
    for order in orders + orders:
        assert _fields(planner.plan(order)) == _fields(plan_memory(g.rg, order))
