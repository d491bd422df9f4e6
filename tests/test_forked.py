"""Work beside the command in a forked child (onnx_remat.forked): the value comes back, a child that
fails in any way leaves the parent to compute it (so errors are raised as without the fork), and the
commands that use it write the same graphs and figures with the fork as without it."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import tempfile
import time
from pathlib import Path

import onnx
import pytest
from conftest import artifacts_dir

import onnx_remat
from onnx_remat import forked
from onnx_remat.analysis.model import analyze_model
from onnx_remat.errors import RematError
from onnx_remat.forked import Forked, beside, worth_running_beside
from onnx_remat.ortsim.check_process import CheckProcess
from onnx_remat.ortsim.registry import check_runtime_support
from onnx_remat.remat.budget import BudgetPlanner
from onnx_remat.scheduling.schedule import ScheduleResult, check_scheduled

PARENT = os.getpid()


def in_child() -> bool:
    return os.getpid() != PARENT


def test_the_value_comes_back_from_the_child():
    work = Forked.start(lambda: ("answer", 42, os.getpid()))
    assert work.in_child
    name, value, pid = work.result()
    assert (name, value) == ("answer", 42) and pid != PARENT  # computed there
    big = Forked.start(lambda: list(range(1_000_000)))  # far more than a pipe holds at once
    assert big.result() == list(range(1_000_000))


def test_a_failing_child_leaves_the_parent_to_compute():
    def fails_there() -> int:
        if in_child():
            raise ValueError("only in the child")
        return 7

    assert Forked.start(fails_there).result() == 7

    def killed_there() -> int:
        if in_child():
            os.kill(os.getpid(), signal.SIGKILL)
        return 8

    assert Forked.start(killed_there).result() == 8
    # a value pickle cannot send (a lambda) comes from the parent too
    made = Forked.start(lambda: lambda: 9).result()
    assert made() == 9


def test_an_error_is_raised_as_without_the_fork():
    def refuses() -> None:
        raise RematError("model.onnx: refused")

    with pytest.raises(RematError, match="^model.onnx: refused$"):
        Forked.start(refuses).result()


def test_the_value_is_taken_once():
    work = Forked.start(lambda: 1)
    assert work.result() == 1
    with pytest.raises(RuntimeError, match="taken already"):
        work.result()


def test_cancel_stops_the_child():
    def forever() -> None:
        while in_child():
            time.sleep(1)

    began = time.monotonic()
    with Forked.start(forever) as work:
        pid = work._pid
    assert time.monotonic() - began < 10
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped already


def test_a_check_after_the_value_runs_while_the_parent_works(tmp_path):
    """start(then=...): the child sends its value, then runs the check on its own state; the parent
    has the value before the check ends, and its verdict from confirmed()."""
    started = tmp_path / "check started"

    def slow_check() -> None:
        started.write_text("")
        time.sleep(1)

    work = Forked.start(lambda: os.getpid(), then=slow_check)
    pid = work.result()
    assert pid != PARENT
    began = time.monotonic()
    while not started.exists() and time.monotonic() - began < 20:
        time.sleep(0.01)
    assert started.exists()  # the check runs now, after the value was sent
    os.waitpid(pid, os.WNOHANG)  # the child is not reaped yet: it still checks
    assert work.confirmed()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped with the verdict

    def failing_check() -> None:
        raise RuntimeError("postcondition broken")

    work = Forked.start(lambda: 5, then=failing_check)
    assert work.result() == 5 and not work.confirmed()
    assert not work.confirmed()  # the verdict, asked again

    def dies() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    work = Forked.start(lambda: 6, then=dies)
    assert work.result() == 6 and not work.confirmed()  # no verdict: not confirmed

    # computed here (the child failed): the parent's compute includes the check, so it stands
    def fails_there() -> int:
        if in_child():
            raise ValueError("only in the child")
        return 7

    work = Forked.start(fails_there, then=failing_check)
    assert work.result() == 7 and work.confirmed()
    with pytest.raises(RuntimeError, match="taken first"):
        Forked.start(lambda: 1, then=slow_check).confirmed()


def test_cancel_stops_a_check_after_the_value():
    def forever() -> None:
        while in_child():
            time.sleep(1)

    began = time.monotonic()
    with Forked.start(lambda: 1, then=forever) as work:
        assert work.result() == 1
        pid = work._pid
    assert time.monotonic() - began < 10
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped already
    assert not work.confirmed()  # stopped before its verdict


def test_small_graphs_compute_in_the_command(monkeypatch):
    assert not worth_running_beside(forked.FORK_MIN_NODES)
    work = beside(lambda: os.getpid(), forked.FORK_MIN_NODES)
    assert not work.in_child and work.result() == PARENT
    monkeypatch.setattr(forked, "FORK_MIN_NODES", 0)
    assert beside(lambda: os.getpid(), 1).in_child


def _outputs(tmp_path, tag: str) -> dict:
    """What apply (a selection, and a budget) and schedule write and report on the examples."""
    out = {}
    for name, scope in (("blocks10", "Block"), ("gpt", "Block"), ("fc5", "FCBlock")):
        applied = onnx_remat.apply(artifacts_dir(name), scopes=scope)
        saved = applied.save(tmp_path / f"{tag}_{name}_apply", force=True)
        out[name, "apply"] = (saved.joinpath("training_model.onnx").read_bytes(), applied.summary())
    # the rounds and the references; a budget just below the references' peak, so that they are
    # scheduled (ahead, with the fork); the floor's candidates
    planner = BudgetPlanner(analyze_model(artifacts_dir("blocks10")))
    below_references = min(r.peak for r in planner.references()) - 1
    for budget in ("50%", below_references, "min"):
        budgeted = onnx_remat.apply(artifacts_dir("blocks10"), budget=budget)
        saved = budgeted.save(tmp_path / f"{tag}_budget", force=True)
        out["blocks10", budget] = (saved.joinpath("training_model.onnx").read_bytes(), budgeted.summary())
    scheduled = onnx_remat.schedule(artifacts_dir("gpt"))
    saved = scheduled.save(tmp_path / f"{tag}_schedule", force=True)
    out["gpt", "schedule"] = (saved.joinpath("training_model.onnx").read_bytes(), scheduled.summary())
    return out


def test_commands_write_the_same_with_the_fork(tmp_path, monkeypatch):
    started = []
    start = Forked.start.__func__  # type: ignore[attr-defined]

    def counted(cls, compute, **kw):
        started.append(compute)
        return start(cls, compute, **kw)

    monkeypatch.setattr(Forked, "start", classmethod(counted))
    in_command = _outputs(tmp_path, "in_command")
    assert not started  # the examples are small: nothing forked
    monkeypatch.setattr(forked, "FORK_MIN_NODES", 0)  # every graph is large enough
    with_fork = _outputs(tmp_path, "forked")
    # the original's estimate (3 applies), each schedule's last policy (5 applies, 1 schedule), the
    # budget planner's costs and second reference plan, and schedules made ahead, at least
    assert len(started) >= 12
    assert with_fork.keys() == in_command.keys()
    for key in in_command:
        assert with_fork[key][0] == in_command[key][0], key
        assert with_fork[key][1] == in_command[key][1], key


def test_a_rewrite_whose_check_fails_only_in_its_child_is_ordered_again(tmp_path, monkeypatch):
    """The pipeline orders the rewrite while its child checks it; where only the child's check fails,
    the rewrite is made again here and ordered again: apply writes what it writes without the fork."""
    from onnx_remat.remat.rewrite import RecomputeRewrite

    def write(tag: str) -> bytes:
        result = onnx_remat.apply(artifacts_dir("blocks10"), scopes=["Block"])
        return result.save(tmp_path / tag, force=True).joinpath("training_model.onnx").read_bytes()

    in_command = write("in_command")
    monkeypatch.setattr(forked, "FORK_MIN_NODES", 0)
    ensures = RecomputeRewrite.ensures
    here: list[str] = []

    def fails_in_the_child(self, tg, result):
        if forked.in_forked_child():
            raise RuntimeError("broken in the child")
        here.append("checked")
        ensures(self, tg, result)

    monkeypatch.setattr(RecomputeRewrite, "ensures", fails_in_the_child)
    assert write("forked") == in_command
    assert here == ["checked"]  # the rewrite made again here, and checked here


def _unknown_op_model() -> onnx.ModelProto:
    """A graph onnxruntime 1.19 refuses (an op it does not know)."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])
    node = onnx.helper.make_node("NoSuchOp", ["x"], ["y"], name="n")
    graph = onnx.helper.make_graph([node], "g", [x], [y])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=9)


def _scheduled(model: onnx.ModelProto) -> ScheduleResult:
    result = ScheduleResult(model, 0, 0, None, [])
    result.checking = CheckProcess.start(model)
    return result


def test_the_check_process_gives_the_checks_verdict():
    passed = CheckProcess.start(onnx.load(artifacts_dir("fc5") / "training_model.onnx"))
    refused = CheckProcess.start(_unknown_op_model())
    assert passed is not None and refused is not None
    assert passed.result() is True
    assert refused.result() is False
    assert not list(Path(tempfile.gettempdir()).glob("onnx-remat-check-*"))  # its files are gone
    stopped = CheckProcess.start(_unknown_op_model())
    assert stopped is not None
    stopped.cancel()
    assert stopped.returncode is not None  # reaped


def test_a_check_started_ahead_is_taken_or_raised_as_the_check_raises():
    with pytest.raises(RematError) as sequential:
        check_runtime_support(_unknown_op_model(), "rewritten model")
    refused = _unknown_op_model()
    result = _scheduled(refused)
    with pytest.raises(RematError) as ahead:
        check_scheduled(result, refused, "rewritten model")
    assert str(ahead.value) == str(sequential.value)  # named as the caller names it
    assert result.checking is None
    # a check of another model than the one written is not taken: the model given is checked
    result = _scheduled(onnx.load(artifacts_dir("fc5") / "training_model.onnx"))
    with pytest.raises(RematError) as other:
        check_scheduled(result, refused, "rewritten model")
    assert str(other.value) == str(sequential.value)
    assert str(other.value).startswith("rewritten model: ops onnxruntime 1.19 does not know")


def test_apply_and_schedule_take_the_check_the_schedule_started(monkeypatch):
    import onnx_remat.scheduling.schedule as schedule_module

    checked = []
    check = schedule_module.check_runtime_support

    def counted(model, where="model", **kw):
        checked.append(where)
        return check(model, where, **kw)

    started = []
    start = CheckProcess.start.__func__  # type: ignore[attr-defined]

    def counted_start(cls, model, path=None):
        started.append(len(model.graph.node))
        return start(cls, model, path)

    monkeypatch.setattr(schedule_module, "check_runtime_support", counted)
    monkeypatch.setattr(CheckProcess, "start", classmethod(counted_start))
    onnx_remat.apply(artifacts_dir("blocks10"), scopes="Block")
    # the schedule command's graph moves leaves of its input only: the input's load check judged it
    onnx_remat.schedule(artifacts_dir("fc5"))
    assert checked == ["rewritten model"]  # small: checked here after the schedule
    assert not started
    checked.clear()
    monkeypatch.setattr(forked, "FORK_MIN_NODES", 0)
    onnx_remat.apply(artifacts_dir("blocks10"), scopes="Block")
    onnx_remat.schedule(artifacts_dir("fc5"))
    # one check started, of the rewrite, beside its emulation: the schedule moves its leaves only
    assert len(started) == 1
    assert checked == []  # the verdicts came from the check started ahead, or the input's
    onnx_remat.schedule(artifacts_dir("gpt"))  # no order lowers its peak: the input as it was
    assert len(started) == 1 and checked == []
    # the chosen plan's schedule was made ahead, in a child beside the planner's rounds, and the
    # graph it writes checked there: the verdict comes with it, nothing is checked here
    onnx_remat.apply(artifacts_dir("blocks10"), budget="50%")
    assert len(started) == 1 and checked == []


def test_large_graphs_plans_keep_their_models_as_wire_bytes(monkeypatch):
    from onnx_remat.remat.budget import ParkedRewrite

    monkeypatch.setattr(forked, "FORK_MIN_NODES", 0)  # every graph is large enough
    planner = BudgetPlanner(analyze_model(artifacts_dir("blocks10")), schedule=True)
    ref = planner.references()[0]
    assert isinstance(ref._rewrite, ParkedRewrite)
    clones = ref.clones
    assert clones > 0  # its figures read no model
    again = planner.pipeline.run(ref.plan)  # the same plan rewritten and ordered anew
    first, second = ref.rewrite, ref.rewrite
    assert first is not None and second is not None and first.model is not second.model  # read each time
    assert first.model.SerializeToString() == again.ordered.model.SerializeToString()
    assert first.segments and first.clone_count == clones
    # a plan's copies share what is parked, so each rewrite is scheduled once
    copy = dataclasses.replace(ref)
    made = []
    schedule = planner._schedule
    monkeypatch.setattr(planner, "_schedule", lambda r, **kw: made.append(r) or schedule(r, **kw))
    assert planner.scheduled(ref._rewrite) == planner.scheduled(copy._rewrite)
    assert len(made) == 1


def test_a_child_forks_no_child_of_its_own(monkeypatch):
    """Work beside the command runs in a child of the command, never of that child: a third
    process would only take turns with the two on the cores."""
    monkeypatch.setattr(forked, "FORK_MIN_NODES", 0)
    assert worth_running_beside(1)
    work = Forked.start(lambda: (os.getpid(), worth_running_beside(1), forked.large_graph(1)))
    assert work.in_child
    pid, beside_there, large_there = work.result()
    assert pid != os.getpid() and not beside_there and large_there
    assert worth_running_beside(1)


@pytest.mark.parametrize("staged_limit", [20, 1])
def test_on_a_large_graph_the_recompute_outputs_reference_is_planned_in_a_child(monkeypatch, staged_limit):
    """The --recompute-outputs reference is planned and evaluated beside the per-layer one. Where
    its stages clone too much (STAGED_LIMIT 1 on blocks10's 10-block chain) this process never plans
    it; where it is made, this process plans it once, to name its own nodes, and the references,
    their figures and the notes are those made without the fork."""
    from onnx_remat.remat import budget
    from onnx_remat.remat.plan import Planner

    monkeypatch.setattr(budget, "STAGED_LIMIT", staged_limit)
    plans = []
    plan = Planner.plan

    def counted(self, selection, **kw):
        if selection.recompute_outputs:
            plans.append(os.getpid())
        return plan(self, selection, **kw)

    monkeypatch.setattr(Planner, "plan", counted)
    analysis = analyze_model(artifacts_dir("blocks10"))
    alone = BudgetPlanner(analysis)
    refs_alone = [(r.source, r.peak, r.cost, r.clones, r.observed) for r in alone.references()]
    assert plans == [PARENT]
    plans.clear()
    monkeypatch.setattr(forked, "FORK_MIN_NODES", 0)
    started = []
    start = Forked.start.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(Forked, "start", classmethod(lambda cls, c, **kw: started.append(c) or start(cls, c, **kw)))
    beside_it = BudgetPlanner(analysis)
    refs = [(r.source, r.peak, r.cost, r.clones, r.observed) for r in beside_it.references()]
    assert refs == refs_alone and beside_it.reference_notes == alone.reference_notes
    assert len(refs) == (2 if staged_limit == 20 else 1)
    # the costs beside the original's emulation, then the reference, and the per-layer reference's
    # rewrite (in a child of its own: RecomputeRewrite on a large graph)
    assert len(started) == 3
    # the parent plans it only to have it in its own nodes
    assert plans == ([PARENT] if staged_limit == 20 else [])
    if staged_limit == 1:
        assert any("not estimated as a reference" in n for n in beside_it.reference_notes)


def test_cleanup_runs_once_the_child_is_gone(tmp_path):
    left = tmp_path / "left"

    def cleanup():
        assert not left.exists()  # once
        left.write_text("cleaned")

    taken = Forked.start(lambda: 5, cleanup=cleanup)
    assert taken.result() == 5 and left.read_text() == "cleaned"
    left.unlink()
    with Forked.start(lambda: time.sleep(60), cleanup=cleanup) as stopped:
        assert not left.exists()
    assert left.read_text() == "cleaned"
    stopped.cancel()  # (again: nothing more)


def _gone(pid: int) -> bool:
    """No such process, or only its exit status is left (a zombie nobody reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state == "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_check_process_dies_with_the_process_that_started_it(tmp_path):
    """A forked child stopped while its check runs leaves no check running (here one held stopped
    in its check, which only the parent-death signal ends)."""
    handed = tmp_path / "model.onnx"
    pid_file = tmp_path / "check.pid"
    model = onnx.load(artifacts_dir("blocks10") / "training_model.onnx")

    def check_then_wait() -> None:
        checking = CheckProcess.start(model, str(handed))
        assert checking is not None
        pid = checking.pid
        # The model is written by the check's own process before its exec; once it runs the check
        # (exec'd) and the file is gone, it has read it, and its parent-death signal is armed.
        while b"check_process" not in Path(f"/proc/{pid}/cmdline").read_bytes() or handed.exists():
            time.sleep(0.005)
        os.kill(pid, signal.SIGSTOP)
        pid_file.write_text(str(pid))
        time.sleep(60)

    check_pid = None
    try:
        with Forked.start(check_then_wait):
            deadline = time.monotonic() + 30
            while not pid_file.exists() or not pid_file.read_text():
                assert time.monotonic() < deadline
                time.sleep(0.05)
            check_pid = int(pid_file.read_text())
            assert not _gone(check_pid)
        deadline = time.monotonic() + 10
        while not _gone(check_pid):
            assert time.monotonic() < deadline, "the check process outlived the child that started it"
            time.sleep(0.05)
    finally:
        if check_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(check_pid, signal.SIGKILL)
