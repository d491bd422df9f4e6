"""The load check in a forked child (onnx_remat.forked_check): the same verdict and sizes as in the
command, for valid graphs and for every kind of broken one the mutation fuzzer makes."""

from __future__ import annotations

import os
import random
import signal

import onnx
import pytest
from conftest import artifacts_dir

from benchmarks.mutate import MUTATIONS
from onnx_remat import model_io
from onnx_remat.analysis.model import analyze_model
from onnx_remat.errors import RematError, UsageError
from onnx_remat.forked_check import ForkedCheck

EXAMPLES = ("fc5", "gpt", "blocks10_dynamo")


def _tiny() -> onnx.ModelProto:
    return onnx.helper.make_model(onnx.helper.make_graph([], "tiny", [], []))


def test_the_childs_answer_comes_back():
    model = _tiny()
    assert ForkedCheck.start(lambda: model, "m").result().SerializeToString() == model.SerializeToString()
    assert ForkedCheck.start(lambda: None, "m").result() is None


def test_a_refusal_comes_back_as_the_error_raised():
    def refuse():
        raise UsageError("m: not like that")

    with pytest.raises(UsageError, match="^m: not like that$"):
        ForkedCheck.start(refuse, "m").result()


def test_an_internal_error_stays_one():
    def broken():
        raise KeyError("oops")

    with pytest.raises(RuntimeError, match="KeyError"):
        ForkedCheck.start(broken, "m").result()


def test_a_child_that_dies_without_an_answer_is_a_refusal():
    def crash():
        os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(RematError, match=r"^m: ONNX's checks of it crashed \(signal 9\)"):
        ForkedCheck.start(crash, "m").result()


def test_cancel_stops_the_child():
    def forever():
        signal.pause()

    check = ForkedCheck.start(forever, "m")
    check.cancel()
    with pytest.raises(ProcessLookupError):
        os.kill(check._pid, 0)  # reaped


def _outcome(path, **options) -> tuple:
    """What analyze_model makes of ``path``: its error (type and line) or every tensor's size (its
    graph read too: a deferred graph raises what the analysis meets there)."""
    try:
        analysis = analyze_model(path, **options)
        analysis.graph  # noqa: B018
    except RematError as exc:
        return (type(exc).__name__, str(exc))
    sizes = analysis.sizes
    names = sorted({t for n in analysis.model.graph.node for t in [*n.input, *n.output] if t})
    return ("ok", [(t, sizes.shape(t), sizes.nbytes(t)) for t in names])


@pytest.mark.parametrize("name", EXAMPLES)
def test_forked_and_in_command_checks_agree_on_every_mutant(name, tmp_path, monkeypatch):
    original = onnx.load(str(artifacts_dir(name) / "training_model.onnx"))
    cases = [("original", original)]
    rng = random.Random(5)
    for kind, mutate in MUTATIONS.items():
        if kind.startswith("external"):
            continue  # about the files around the model, read before any check
        model = onnx.ModelProto()
        model.CopyFrom(original)
        mutate(model, rng)
        cases.append((kind, model))
    refused = 0
    started = []
    start = ForkedCheck.start

    def counted(check, where):
        started.append(where)
        return start(check, where)

    monkeypatch.setattr(ForkedCheck, "start", staticmethod(counted))
    for kind, model in cases:
        path = tmp_path / f"{kind}.onnx"
        path.write_bytes(model.SerializeToString())
        before = len(started)
        in_command = _outcome(path)
        assert len(started) == before  # small: checked in the command
        with monkeypatch.context() as patch:
            patch.setattr(model_io, "FORKED_CHECK_MIN_NODES", 0)  # every graph is large enough
            forked = _outcome(path)
        assert forked == in_command, kind
        refused += in_command[0] != "ok"
    assert len(started) == len(cases)  # each checked in a child
    assert refused >= len(cases) // 2  # the broken ones are refused, by both


@pytest.mark.parametrize("name", EXAMPLES)
def test_a_deferred_graph_beside_a_forked_check_meets_what_the_analysis_meets(name, tmp_path, monkeypatch):
    """``defer_graph`` (the schedule command) with the check in a child: the sizes inferred in the
    command while the check runs, not read off the check's typed skeleton, are the same, and every
    mutant gets the same refusal or the same sizes as the analysis made at once in the command."""
    original = onnx.load(str(artifacts_dir(name) / "training_model.onnx"))
    cases = [("original", original)]
    rng = random.Random(7)
    for kind, mutate in MUTATIONS.items():
        if kind.startswith("external"):
            continue
        model = onnx.ModelProto()
        model.CopyFrom(original)
        mutate(model, rng)
        cases.append((kind, model))
    refused = 0
    for kind, model in cases:
        path = tmp_path / f"{kind}.onnx"
        path.write_bytes(model.SerializeToString())
        in_command = _outcome(path)
        with monkeypatch.context() as patch:
            patch.setattr(model_io, "FORKED_CHECK_MIN_NODES", 0)
            deferred = _outcome(path, defer_graph=True)
        assert deferred == in_command, kind
        refused += in_command[0] != "ok"
    assert refused >= len(cases) // 2
