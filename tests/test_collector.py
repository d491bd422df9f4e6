"""The library's entry points run with the cyclic garbage collector paused (onnx_remat.collector)
and leave it as they found it."""

from __future__ import annotations

import gc

import pytest
from conftest import artifacts_dir

import onnx_remat
from onnx_remat import collector
from onnx_remat.analysis import model as analysis_model
from onnx_remat.estimate import estimate
from onnx_remat.remat.plan import Planner


@pytest.fixture
def collector_state():
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


@pytest.mark.parametrize("enabled", [True, False])
def test_paused_turns_it_off_and_back_to_where_it_was(enabled, collector_state):
    gc.enable() if enabled else gc.disable()
    seen = []

    @collector.pauses
    def inner():
        seen.append(gc.isenabled())
        with collector.paused():
            seen.append(gc.isenabled())
        seen.append(gc.isenabled())
        raise ValueError("out")

    with pytest.raises(ValueError):
        inner()
    assert seen == [False, False, False]
    assert gc.isenabled() is enabled
    assert inner.__name__ == "inner"


def _entry_points():
    from onnx_remat import estimate as estimate_module
    from onnx_remat.remat.pipeline import RewritePipeline
    from onnx_remat.scheduling.schedule import MemorySchedule

    path = artifacts_dir("fc5")
    # each with a function only its own body calls, after what it shares with the others
    return {
        "analyze_model": (lambda: onnx_remat.analyze_model(path), analysis_model, "_analyze"),
        "plan": (lambda: onnx_remat.plan(_analysis(path), scopes=["FCBlock"]), Planner, "plan"),
        "apply": (lambda: onnx_remat.apply(path, scopes=["FCBlock"]), RewritePipeline, "checked"),
        "schedule": (lambda: onnx_remat.schedule(path), MemorySchedule, "__call__"),
        "estimate": (lambda: estimate(path, scopes=["FCBlock"]), estimate_module, "scope_rows"),
    }


def _analysis(path):
    with collector.paused():  # made outside the call watched
        return onnx_remat.analyze_model(path)


@pytest.mark.parametrize("entry", ["analyze_model", "plan", "apply", "schedule", "estimate"])
def test_every_entry_point_runs_with_it_paused(entry, monkeypatch, collector_state):
    call, owner, name = _entry_points()[entry]
    seen: list[bool] = []
    real = getattr(owner, name)

    def watched(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, watched)
    gc.enable()
    call()
    assert seen and not any(seen)
    assert gc.isenabled()
