"""The memory schedule pass, and ``onnx_remat.schedule`` (``onnx-remat schedule``).

>>> import onnx_remat
>>> result = onnx_remat.schedule("models/artifacts/blocks10")   # nothing written yet
>>> result.estimate_before.planned_peak_bytes, result.estimate_after.planned_peak_bytes
>>> result.save("blocks10_scheduled")                           # an artifacts directory

:class:`MemorySchedule` is a functional pass: a training graph (``onnx.ModelProto``) in, a
:class:`ScheduleResult` with a new ModelProto out, whose planned peak, as onnxruntime 1.19 would
plan it on CPU, is no higher than the input's; the input is not changed. It computes nothing
differently: the same nodes run (plus zero-copy ``PassThrough`` nodes where an order needs one),
and where partial gradients are accumulated in place they are added in the gradient builder's
order (:mod:`~onnx_remat.scheduling.accumulate`), so loss and gradients keep every bit.

How, in the manner of XLA's memory scheduler (several list schedulers, keep the lowest estimate),
with onnxruntime's own order as the model of what the node list can make it do:

1. emulate what onnxruntime runs (:mod:`onnx_remat.ortsim`: its graph rewrites, its DEFAULT
   order, its allocation planner and memory pattern): the input's planned peak;
2. optionally rewrite the parameter gradient sums (``grad_accumulation``), and emulate that too;
   where a shared weight's gradient is a sum of partials, also the graph that makes each partial
   as soon as its call's gradient exists (:mod:`~onnx_remat.scheduling.partials`);
3. for each graph, let each list scheduler of :mod:`~onnx_remat.scheduling.orders` propose an
   order, and predict what onnxruntime runs when the graph's leaves (gradient accumulators, the
   loss) are placed in that order's rank at the end of the node list (all a node list can say
   without adding nodes, :mod:`~onnx_remat.scheduling.realize`); plan its memory;
4. write the best predictions (in order; one no lower than a peak already verified is not
   written), keep forward random ops in their original order (``PassThrough``
   pins, only where the new order would change it), and emulate each written graph again, from
   scratch: the planned peak reported is the written graph's, never a prediction (where the
   written graph runs exactly the predicted steps, the predicted plan is its plan:
   :meth:`~onnx_remat.ortsim.emulation.Emulation.adopt_plan`);
5. keep the lowest; when nothing beats the input, the input comes back unchanged.

Linear or n log n per order tried (a handful): each step walks the graph a constant number of
times with heaps, no recursion.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from onnx_remat import collector
from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.errors import RematError
from onnx_remat.forked import Forked, large_graph, worth_running_beside
from onnx_remat.graph.kernel_workarounds import WORKAROUND_NOTE, fix_grouped_conv_grads
from onnx_remat.ortsim.check_process import CheckProcess, CheckVerdict
from onnx_remat.ortsim.emulation import (
    DEFAULT_ORDER,
    Emulation,
    emulate,
    emulate_rewrite,
    keep_random_order,
    runs_the_same,
    stand_in,
)
from onnx_remat.ortsim.graph import nodes_io
from onnx_remat.ortsim.planner import MemoryPlan, plan_memory, prepare_plans
from onnx_remat.ortsim.registry import check_runtime_support
from onnx_remat.scheduling.accumulate import (
    MODES,
    AccumulatedGradient,
    AccumulationResult,
    accumulate_gradients,
    may_have_parameter_sums,
)
from onnx_remat.scheduling.orders import POLICIES, LeafOrders, ListScheduler
from onnx_remat.scheduling.partials import PARTIALS_EARLY, fused_nodes, gate_partials, same_fusions
from onnx_remat.scheduling.realize import LeafPlacer
from onnx_remat.units import plural

if TYPE_CHECKING:
    from onnx_remat.analysis.model import ModelAnalysis, ModelLike
    from onnx_remat.memory import MemoryEstimate

DEFAULT_ACCUMULATION = "inplace"


@dataclass(frozen=True)
class PredictedPeak:
    """What a forked child sends back of an order's memory plan: its planned peak. A whole plan is
    an object per tensor, 0.5-0.9 s to send at 10^5 nodes; the plan of an order that is written
    is made by the written graph's emulation (:meth:`~onnx_remat.ortsim.emulation.Emulation.plan`),
    which a plan made here would have saved (:meth:`~onnx_remat.ortsim.emulation.Emulation.adopt_plan`)."""

    planned_peak_bytes: int


# An order predicted on an emulated graph (node indices of that graph) and its memory plan.
Prediction = tuple[list[int], MemoryPlan | PredictedPeak]


@dataclass
class Candidate:
    """One order tried: the graph it orders, the policy, and its planned peaks."""

    graph: str  # "as given", the gradient accumulation mode the graph was rewritten in, or PARTIALS_EARLY
    policy: str  # "as written" (the node list unchanged) or a list scheduler policy
    predicted_peak_bytes: int
    planned_peak_bytes: int | None = None  # of the written graph, emulated again (best few only)

    @property
    def label(self) -> str:
        if self.graph == "as given":
            return self.policy
        if self.graph == PARTIALS_EARLY:
            return f"{self.policy}, shared weights' partial gradients made early"
        return f"{self.policy}, {self.graph} accumulation"

    def to_json(self) -> dict:
        return {
            "graph": self.graph,
            "policy": self.policy,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "planned_peak_bytes": self.planned_peak_bytes,
        }


@dataclass
class ScheduleResult:
    """What :class:`MemorySchedule` returns: the scheduled model and how it got there."""

    model: onnx.ModelProto
    planned_peak_before: int  # emulated planned peak of the input
    planned_peak_after: int  # of ``model``
    chosen: Candidate | None  # None: the input came back unchanged
    candidates: list[Candidate]
    accumulated: list[AccumulatedGradient] = field(default_factory=list)
    accumulation_skipped: list[tuple[str, str]] = field(default_factory=list)
    # shared weights' partial gradients made early (scheduling/partials.py): partial -> the
    # gradient tensors whose other readers wait for it (empty unless that graph was chosen)
    partials_early: dict[str, list[str]] = field(default_factory=dict)
    pins: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # of ``model``: what onnxruntime runs (None in an apply result: apply lets it go once estimated)
    emulation: Emulation | None = field(default=None, repr=False)
    # ``check_runtime_support`` of ``model``, running in a child process since the schedule wrote
    # it (MemorySchedule(check_ahead=True)), or its verdict from the process that made the schedule
    # (the budget planner's schedules made ahead): taken by check_scheduled
    checking: CheckProcess | CheckVerdict | None = field(default=None, repr=False, compare=False)

    @property
    def changed(self) -> bool:
        return self.chosen is not None

    def summary(self) -> dict:
        return {
            "planned_peak_bytes_before": self.planned_peak_before,
            "planned_peak_bytes_after": self.planned_peak_after,
            "chosen": self.chosen.to_json() if self.chosen else None,
            "candidates": [c.to_json() for c in self.candidates],
            "accumulated": [a.to_json() for a in self.accumulated],
            "accumulation_skipped": [{"parameter": p, "reason": r} for p, r in self.accumulation_skipped],
            "partials_early": self.partials_early,
            "random_order_pins": self.pins,
            "notes": self.notes,
        }


class MemorySchedule:
    """The schedule pass: ``MemorySchedule()(model, sizes)`` returns a :class:`ScheduleResult`.

    ``grad_accumulation``: ``"inplace"`` (default: partial gradient sums added in place, exact in
    every case), ``"early"`` (each partial into the gradient buffer as it exists: bit-identical on a
    step with reset gradients, rounds differently across accumulation steps; see
    :mod:`~onnx_remat.scheduling.accumulate`) or ``"sum"`` (sums as written). ``policies``: the
    list schedulers to try; ``verify``: how many of the best predictions may be written and
    emulated again (in predicted order; one predicted no lower than a peak already verified is not).
    ``check_ahead``: on a large graph, start the output's validity check
    (:func:`~onnx_remat.ortsim.registry.check_runtime_support`) of each written graph in a child
    process while it is emulated (:class:`~onnx_remat.ortsim.check_process.CheckProcess`:
    ``ScheduleResult.checking``, which :func:`check_scheduled` takes).
    """

    def __init__(
        self,
        *,
        grad_accumulation: str = DEFAULT_ACCUMULATION,
        policies: Sequence[str] = POLICIES,
        verify: int = 3,
        check_ahead: bool = False,
    ):
        if grad_accumulation not in MODES:
            raise ValueError(f"grad_accumulation must be one of {', '.join(MODES)}, not {grad_accumulation!r}")
        self.grad_accumulation = grad_accumulation
        self.policies = tuple(policies)
        self.verify = verify
        self.check_ahead = check_ahead

    def __call__(
        self,
        model: onnx.ModelProto | Emulation,
        sizes: TensorSizes | None = None,
        *,
        random_order: Sequence[str] | None = None,
        model_check: CheckProcess | CheckVerdict | None = None,
    ) -> ScheduleResult:
        """Schedule ``model`` (``sizes``: its tensor sizes, symbolic dimensions bound; not changed),
        or the graph of an :class:`~onnx_remat.ortsim.emulation.Emulation` of it, which is then used
        rather than made again.

        ``random_order``: names of the forward random ops in the order their draws must keep
        (default: the order onnxruntime runs ``model`` in, emulated). Where ``model`` itself runs
        them in another order (a recompute rewrite may), it is pinned first
        (:func:`~onnx_remat.ortsim.emulation.keep_random_order`), and that is the graph any
        order must beat.

        ``model_check``: onnxruntime's verdict on ``model`` (a
        :class:`~onnx_remat.ortsim.check_process.CheckProcess` still running, or a
        :class:`~onnx_remat.ortsim.check_process.CheckVerdict`), which this call takes over. A graph
        written from ``model`` by moving its leaves is the same nodes in another topological order
        (:attr:`~onnx_remat.scheduling.realize.LeafPlacer.sorted_as_given`), so that verdict is its
        own: it is handed on (``ScheduleResult.checking``) rather than a check started for it. It
        is cancelled where the result is another graph (random-op pins, the gradients accumulated
        another way)."""
        if isinstance(model, Emulation):
            # a stand-in's node indices are another node list's: the predictions read them as its own
            given = model if not model.stands_in else emulate(model.model, model.sizes, shapes_known=True, io=model.io)
        elif sizes is None:
            raise TypeError("MemorySchedule: give the model's sizes, or an Emulation of it")
        else:
            given = emulate(model, sizes)
        wanted_random = list(random_order) if random_order is not None else given.random_order()
        checked_model = given.model  # the graph model_check judges
        given, given_pins = keep_random_order(given, wanted_random)
        checks = _WrittenChecks(model_check if given.model is checked_model else None, given, self._check_ahead)
        if model_check is not None and checks.inherited is None:
            model_check.cancel()  # given was pinned: not the graph it judges
        verifying: dict[int, Forked[list[str] | None]] = {}  # id(predicted order) -> its written graph's check
        placers: dict[int, LeafPlacer] = {}  # per graph (by id), its nodes and leaves read once
        try:
            # The given graph is predicted before the gradients are accumulated another way: the
            # check of the first order it predicts (in a forked child: _verify_first), which the
            # writes wait for, starts before that graph is made and emulated, not after.
            candidates = self._candidates("as given", given, given, verifying, placers)
            # (both passes below look for parameters' gradient sums: most graphs have none, read once here)
            sums = may_have_parameter_sums(given.model)
            accumulation = (
                accumulate_gradients(given.model, given.rg, given.order, self.grad_accumulation)
                if sums
                else AccumulationResult(given.model, [], [])
            )
            if accumulation.gradients:
                acc_sizes = TensorSizes(accumulation.model, given.sizes.dims)
                accumulated = emulate(accumulation.model, acc_sizes)
                candidates += self._candidates(self.grad_accumulation, accumulated, given, verifying, placers)
            # Shared weights' partial gradients made as soon as their call's gradient exists: one more
            # graph, only where a weight's gradient is a sum of partials (scheduling/partials.py).
            gating = gate_partials(given.model, fused_nodes(given.rg)) if sums else None
            if gating is not None:
                gated = emulate(gating.model, TensorSizes(gating.model, given.sizes.dims))
                if same_fusions(gated.rg, given.rg):  # else a node would round differently: not tried
                    candidates += self._candidates(PARTIALS_EARLY, gated, given, verifying, placers)
                else:
                    gating = None
            candidates.sort(key=lambda c: c[0].predicted_peak_bytes)
            # Only predictions below the input's peak are worth writing (a handful at most).
            promising = [c for c in candidates if c[0].predicted_peak_bytes < given.planned_peak_bytes][: self.verify]
            tried = [c[0] for c in candidates]
            del candidates  # the other predicted plans can go (their figures stay in the Candidates)
            best, best_checking = _write_promising(promising, wanted_random, checks, verifying, placers)
        finally:
            for pending in verifying.values():
                pending.cancel()
            del verifying

        result = ScheduleResult(
            model=given.model,
            planned_peak_before=given.planned_peak_bytes,
            planned_peak_after=given.planned_peak_bytes,
            chosen=None,
            candidates=tried,
            accumulated=accumulation.gradients,
            accumulation_skipped=accumulation.skipped,
            pins=given_pins,
            emulation=given,
        )
        if best is None or best[1].planned_peak_bytes >= given.planned_peak_bytes:
            result.notes.append("no order tried lowers the planned peak: the graph is left as it was")
            result.accumulated = []
            checks.drop(best_checking)
            result.checking = checks.inherited  # given.model is the graph it judges
            return result
        result.chosen, result.emulation, result.model = best[0], best[1], best[1].model
        result.checking = best_checking
        checks.keep_only(best_checking)
        result.pins = given_pins + best[2]
        result.planned_peak_after = best[1].planned_peak_bytes
        if best[0].graph != self.grad_accumulation:
            result.accumulated = []
        if best[0].graph == PARTIALS_EARLY:
            assert gating is not None
            result.partials_early = gating.gated
            result.notes.append(
                f"{plural(len(gating.gated), 'partial gradient')} of shared weights made as soon as their "
                f"call's gradient exists ({plural(gating.gates, 'gate')}; bit-identical: the sums keep their order)"
            )
        return result

    def _candidates(
        self,
        label: str,
        g: Emulation,
        given: Emulation,
        verifying: dict[int, Forked[list[str] | None]],
        placers: dict[int, LeafPlacer],
    ) -> list[_Candidate]:
        """The candidates of graph ``g`` (named ``label``): its node list as written, where it is
        not the given graph, and each policy's prediction, in that order (the caller sorts every
        graph's by predicted peak). Where the predictions are made beside, the graph written for the
        first new order predicted here (the ``freeing`` policy's, the one most often written: it
        comes first among equal predictions) is emulated in a forked child as soon as the order is
        known, to check that it runs as predicted (``verifying``, by the predicted order's id: taken
        by :func:`_write_promising`), with the graph's
        :class:`~onnx_remat.scheduling.realize.LeafPlacer` made here first (into ``placers``), which
        the child and then :func:`_write_promising` read."""
        candidates: list[_Candidate] = []
        if g is not given:
            candidates.append((Candidate(label, "as written", g.planned_peak_bytes), g, None, None))
        for policy, rank, predicted, plan in _predictions(g, self.policies, _verify_first(g, verifying, placers)):
            ranks = _leaf_ranks(g, rank)
            candidates.append((Candidate(label, policy, plan.planned_peak_bytes), g, ranks, (predicted, plan)))
        return candidates

    def _check_ahead(self, written: onnx.ModelProto) -> CheckProcess | None:
        """The validity check of ``written`` started in a child process (``check_ahead``), or None."""
        return start_check(written) if self.check_ahead else None


# A candidate order: what it is, the emulated graph it orders, its leaves' ranks by node name (None:
# the node list as written) and its prediction (None: as written).
_Candidate = tuple[Candidate, Emulation, "dict[str, float] | None", "Prediction | None"]
Checking = CheckProcess | CheckVerdict


class _WrittenChecks:
    """The validity checks of the graphs a schedule writes: ``inherited``, the verdict on the given
    graph (``model_check``), for a graph written by moving the given graph's leaves (the same nodes,
    still sorted: :attr:`~onnx_remat.scheduling.realize.LeafPlacer.sorted_as_given`), else a check
    started for the graph written (``start``, which may start none)."""

    def __init__(
        self, inherited: Checking | None, given: Emulation, start: Callable[[onnx.ModelProto], Checking | None]
    ):
        self.inherited = inherited
        self.given = given
        self.start = start

    def of(self, g: Emulation, placer: LeafPlacer, written: onnx.ModelProto) -> Checking | None:
        """The check of ``written``, a node list of ``g`` that ``placer`` wrote."""
        if self.inherited is not None and g is self.given and placer.sorted_as_given:
            return self.inherited
        return self.start(written)

    def drop(self, checking: Checking | None) -> None:
        """Stop a check no longer wanted (the inherited one stays until :meth:`keep_only`)."""
        if checking is not None and checking is not self.inherited:
            checking.cancel()

    def keep_only(self, checking: Checking | None) -> None:
        """``checking`` is the one handed on: the inherited check goes unless it is that one."""
        if self.inherited is not None and checking is not self.inherited:
            self.inherited.cancel()


def _write_promising(
    promising: list[_Candidate],
    wanted_random: list[str],
    checks: _WrittenChecks,
    verifying: dict[int, Forked[list[str] | None]],
    placers: dict[int, LeafPlacer],
) -> tuple[tuple[Candidate, Emulation, list[str]] | None, Checking | None]:
    """Write the promising candidates' node lists in turn and emulate each again (its random ops
    pinned to ``wanted_random`` where they changed order): the best (candidate, emulation, pins)
    and the check of its graph. Each candidate's ``planned_peak_bytes`` is set where written.

    A graph emulated again in a forked child already (``verifying``: :func:`_runs_as_predicted`, by
    the predicted order's id) is not emulated here: where it runs exactly the predicted steps, its
    emulation is the predicted one (:func:`~onnx_remat.ortsim.emulation.stand_in`), which answers
    every query as the one made here would; where it does not, it is emulated here."""
    best: tuple[Candidate, Emulation, list[str]] | None = None
    best_checking: Checking | None = None  # the check of best's model, started ahead
    checked_lists: dict[tuple[str, ...], int] = {}
    for cand, g, names, prediction in promising:
        if best is not None and cand.predicted_peak_bytes >= best[1].planned_peak_bytes:
            # To win, its written graph would have to plan below its own prediction. Not
            # written: an emulation of the whole graph saved (seen on every graph of the corpus
            # and the examples: no verified order planned below its prediction, 79 of 79).
            continue
        placer = _placer(g, placers)
        positions = placer.positions(names) if names is not None else None
        key = tuple(placer.names[k] for k in positions) if positions is not None else tuple(placer.names)
        if key in checked_lists:  # another policy gave the same node list
            cand.planned_peak_bytes = checked_lists[key]
            continue
        # the node list is known before it is written: a list written already costs no copy
        written = placer.write(positions) if positions is not None else g.model
        checking = checks.of(g, placer, written)
        verified = verifying.pop(id(prediction[0]), None) if prediction is not None else None
        initializers = verified.result() if verified is not None and positions is not None else None
        if positions is None:
            emulated = g  # the graph as written: g is its emulation
        elif prediction is not None and isinstance(prediction[1], MemoryPlan) and initializers is not None:
            emulated = stand_in(g, written, placer.io(positions), prediction[0], prediction[1], initializers)
        else:  # the nodes as read for g: the same node objects, not written ones read again
            io, protos = placer.io(positions), placer.protos(positions)
            emulated = emulate(written, g.sizes, shapes_known=True, io=io, protos=protos)
        if prediction is not None and isinstance(prediction[1], MemoryPlan) and not emulated.stands_in:
            # The written graph is emulated from scratch (onnxruntime's rewrites can depend on
            # the node list's order); where it runs exactly what was predicted, the predicted
            # plan is its plan.
            emulated.adopt_plan(g.rg, prediction[0], prediction[1])
        checked, pins = keep_random_order(emulated, wanted_random)
        cand.planned_peak_bytes = checked_lists[key] = checked.planned_peak_bytes
        if best is None or checked.planned_peak_bytes < best[1].planned_peak_bytes:
            best = (cand, checked, pins)
            checks.drop(best_checking)
            # the check ahead was of the written graph: not of one random-op pins changed
            best_checking, checking = (checking, None) if checked.model is written else (None, checking)
        checks.drop(checking)
    return best, best_checking


def _placer(g: Emulation, placers: dict[int, LeafPlacer]) -> LeafPlacer:
    """The :class:`~onnx_remat.scheduling.realize.LeafPlacer` of ``g``'s model, made once (``placers``,
    by the emulation's id)."""
    placer = placers.get(id(g))
    if placer is None:
        placer = placers[id(g)] = LeafPlacer(g.model, g.io)
    return placer


def _verify_first(
    g: Emulation, verifying: dict[int, Forked[list[str] | None]], placers: dict[int, LeafPlacer]
) -> OrderHook:
    """The hook that starts :func:`_runs_as_predicted` in a forked child for the first new order
    predicted for ``g`` (into ``verifying``, by the order's id), and for no other: with this process
    and the child predicting, another would be a fourth process on two cores. ``g``'s placer is made
    here first (``placers``), so the child and the writes after it share it."""
    started = False

    def new_order(rank: dict[int, int], predicted: list[int]) -> None:
        nonlocal started
        if not started:
            started = True
            ranks = _leaf_ranks(g, rank)
            placer = _placer(g, placers)
            verifying[id(predicted)] = Forked.start(lambda: _runs_as_predicted(g, placer, ranks, predicted))

    return new_order


def _leaf_ranks(g: Emulation, rank: dict[int, int]) -> dict[str, float]:
    """A prediction's leaf ranks (by runtime node) as the ranks of the model's nodes, by name."""
    return {name: float(k) for i, k in rank.items() for name in g.rg.at(i).origin}


def _runs_as_predicted(
    g: Emulation, placer: LeafPlacer, ranks: dict[str, float], predicted: list[int]
) -> list[str] | None:
    """Whether the graph written from ``g``'s model with its leaves ranked by ``ranks`` (``placer``:
    the model's :class:`~onnx_remat.scheduling.realize.LeafPlacer`) runs, emulated from scratch as
    :func:`_write_promising` emulates it, exactly ``predicted`` of ``g``'s graph
    (:func:`~onnx_remat.ortsim.emulation.runs_the_same`): then its initializers' names, in its
    order; else None. Made in a forked child: it changes ``g``'s sizes, as that emulation does (the
    same sizes, added again).

    The written graph differs from ``g.model`` in the order of its node list alone, which the nodes'
    names and protos in that order give the emulation (``io``, ``protos``): of the model itself the
    emulated graph reads only its inputs, outputs, initializers and opset. So the graph is not
    written here (0.45 s at 10^5 nodes)."""
    positions = placer.positions(ranks)
    io, protos = placer.io(positions), placer.protos(positions)
    if io is None:  # read from the nodes in their new order, not from g.model's list
        io = nodes_io(protos)
    emulated = emulate(g.model, g.sizes, shapes_known=True, io=io, protos=protos)
    return list(emulated.rg.initializers) if runs_the_same(emulated, g.rg, predicted) else None


def start_check(written: onnx.ModelProto) -> CheckProcess | None:
    """The validity check of ``written``, the graph a schedule writes, started in a child process
    for :func:`check_scheduled` to take (large graphs only: :func:`~onnx_remat.forked.large_graph`),
    or None."""
    if not large_graph(len(written.graph.node)):
        return None
    return CheckProcess.start(written)


def check_scheduled(result: ScheduleResult | None, model: onnx.ModelProto, where: str) -> None:
    """:func:`~onnx_remat.ortsim.registry.check_runtime_support` of ``model`` (the graph to be
    written; ``where`` names it), taking the verdict of the check the schedule started when it
    wrote ``model`` (``result.checking``), where there is one: what it adds is then the time the
    check takes beyond the emulation and the estimate it ran beside. A refusal there is checked
    again here, so it is raised as the check raises it."""
    checking = result.checking if result is not None else None
    if result is not None:
        result.checking = None
    if checking is not None:
        if result is not None and result.model is model and checking.result():
            return
        checking.cancel()
    check_runtime_support(model, where)


# Called with a prediction's leaf ranks and predicted order as soon as the order is known.
OrderHook = Callable[[dict[int, int], list[int]], None]

# What a list scheduler's policy predicts for a graph: the policy, the rank it gives the graph's
# leaves, the order onnxruntime would then run, and that order's memory plan.
PolicyPrediction = tuple[str, dict[int, int], list[int], MemoryPlan | PredictedPeak]


def _predictions(g: Emulation, policies: Sequence[str], new_order: OrderHook | None = None) -> list[PolicyPrediction]:
    """Each policy's prediction for the graph of ``g``, in the order of ``policies``.

    Policies often predict the same order (the DEFAULT policy: the graph's own, whose plan the
    emulation makes anyway): an order's plan is made once. Each policy's order and plan take about
    2 s at 10^5 nodes, and depend on the graph alone: on a large graph the last policy is predicted
    in a forked child (:class:`onnx_remat.forked.Forked`) while this process predicts the others,
    and the emulation's own plan, where not made yet, after it in the same child, which sends back
    its peak (:meth:`~onnx_remat.ortsim.emulation.Emulation.know_peak`). The child sends back orders
    and planned peaks (:class:`PredictedPeak`), not plans. Its orders are matched against those here,
    so an order planned here keeps its plan, and the predictions' orders and peaks are the
    sequential ones. ``new_order``: where there is a child, called with the rank and the order of
    each prediction made in this process that is not the graph's own order (nor an earlier one's),
    as soon as the order is known (before any plan, and before the child starts)."""
    current = g.order if g.order_source == DEFAULT_ORDER else None  # (not an order given by name)
    scheduler, leaf_orders = ListScheduler(g.rg, g.order), LeafOrders(g.rg, g.first_added, current)
    ends = set(leaf_orders.leaves)

    def known(plans: list[Prediction], predicted: list[int]) -> MemoryPlan | PredictedPeak | None:
        return next((p for o, p in plans if o == predicted), None)

    def ordered(some: Sequence[str]) -> list[tuple[str, dict[int, int], list[int]]]:
        """Each policy's leaf ranks and the order they make onnxruntime run."""
        out = []
        for policy in some:
            target = scheduler.order(policy)
            rank = {i: k for k, i in enumerate(target) if i in ends}
            out.append((policy, rank, leaf_orders.order(rank)))
        return out

    def predict(some: list[tuple[str, dict[int, int], list[int]]], plans: list[Prediction]) -> list[PolicyPrediction]:
        """The orders ``some`` with their plans: each planned once (``plans``: those made already)."""
        out: list[PolicyPrediction] = []
        for policy, rank, predicted in some:
            plan = known(plans, predicted)
            if plan is None:
                plan = plan_memory(g.rg, predicted)
                plans.append((predicted, plan))
            out.append((policy, rank, predicted, plan))
        return out

    if not worth_running_beside(len(g.order)) or len(policies) < 2:
        return predict(ordered(policies), [(g.order, g.plan)])

    own_planned = g.planned

    def predicted_in_child() -> tuple[list[PolicyPrediction], int | None]:
        predicted: list[PolicyPrediction] = [
            (p, rank, order, PredictedPeak(plan.planned_peak_bytes))
            for p, rank, order, plan in predict(ordered(policies[-1:]), [])
        ]
        return predicted, None if own_planned else g.planned_peak_bytes

    # The emulation's own plan is asked for its peak alone, unless no order beats it (then the
    # result is the graph as given, whose plan its estimate reads): where it is not made yet, the
    # child plans it after its policy, and this process takes the peak (Emulation.know_peak). This
    # process finds its policies' orders first (compiled walks: a few hundredths of a second each)
    # and starts work on the new ones (``new_order``) before the child is even started, then plans
    # them while the child works.
    if any(policy != "default" for policy in policies):
        scheduler.prepare()  # shared by the walks here and in the child, rather than made in each
    prepare_plans(g.rg)  # what every plan reads of the graph: read once, for the plans here and there
    own: MemoryPlan | PredictedPeak = g.plan if own_planned else _OWN_PENDING
    plans: list[Prediction] = [(g.order, own)]
    mine = ordered(policies[:-1])
    if new_order is not None:
        seen = [g.order]
        for _, rank, predicted in mine:
            if predicted not in seen:
                new_order(rank, predicted)
                seen.append(predicted)
    with Forked.start(predicted_in_child) as rest:
        out = predict(mine, plans)
        theirs, own_peak = rest.result()
        for policy, rank, predicted, plan in theirs:
            same = known(plans, predicted)
            if same is None:
                plans.append((predicted, plan))
            out.append((policy, rank, predicted, plan if same is None else same))
    if own_peak is not None:
        g.know_peak(own_peak)
    if own is _OWN_PENDING:
        taken = PredictedPeak(g.planned_peak_bytes)
        out = [(p, rank, order, taken if plan is _OWN_PENDING else plan) for p, rank, order, plan in out]
    return out


# Stands for the emulation's own plan in _predictions while a child plans it.
_OWN_PENDING = PredictedPeak(-1)


@dataclass
class OrderedGraph:
    """A rewritten graph after :func:`order_rewrite`: the ``model`` to write, its ``emulation``
    (None where nothing needed one), the memory schedule's result (None: not scheduled) and the
    random-op pins added."""

    model: onnx.ModelProto
    emulation: Emulation | None
    schedule: ScheduleResult | None
    pins: list[str]
    workarounds: list[str] = field(default_factory=list)  # kernels in a form onnxruntime computes correctly


def order_rewrite(
    model: onnx.ModelProto,
    dims: dict[str, int],
    *,
    random_order: Sequence[str],
    schedule: bool = True,
    grad_accumulation: str = DEFAULT_ACCUMULATION,
    emulation: bool = True,
    original_sizes: TensorSizes | None = None,
    check_ahead: bool = False,
    emulated: Emulation | None = None,
) -> OrderedGraph:
    """The order pass after a rewrite: emulate ``model`` once, keep its random ops in
    ``random_order`` (the original graph's draw order; pins only where the rewrite changed it) and,
    with ``schedule``, give it the memory schedule (:class:`MemorySchedule`).

    ``dims`` binds symbolic dimensions. Without ``schedule``, ``emulation`` (whether the caller
    needs the emulation of the result) and two random ops to order, nothing is emulated. Used by
    :func:`onnx_remat.apply` and the budget planner, so every graph they write is ordered the same
    way; ``model`` is not changed. Kernels whose result depends on where tensors live (a reorder
    would change it) are first put in a form onnxruntime computes correctly
    (:mod:`onnx_remat.graph.kernel_workarounds`). ``original_sizes``: the sizes of the emulation of
    the graph ``model`` rewrites, if there is one: ``model``'s are then updated from those
    (:func:`~onnx_remat.ortsim.emulation.emulate_rewrite`), not inferred again. ``check_ahead``:
    the schedule's (:class:`MemorySchedule`), whose check the caller takes with
    :func:`check_scheduled`; the check of ``model`` itself is started first, beside its
    emulation, and stands for the graphs the schedule writes by moving leaves (``model_check``).
    ``emulated``: an emulation of ``model`` made as this pass makes one (``model`` the result of an
    earlier call without ``schedule``, whose emulation it is), used rather than made again where
    the kernel workarounds leave ``model`` as it is.
    """
    model, workarounds = fix_grouped_conv_grads(model)
    if emulated is not None and emulated.model is not model:
        emulated = None  # a workaround changed the graph: the emulation is not of it
    if not schedule and not emulation and len(random_order) < 2:
        return OrderedGraph(model, None, None, [], workarounds)
    # The check of what the schedule writes, started on the rewrite itself, beside its emulation
    # (the second core is otherwise idle there): the schedule's node lists only move leaves, so
    # its verdict is theirs (MemorySchedule's model_check).
    model_check = start_check(model) if schedule and check_ahead else None
    if emulated is not None:
        emu = emulated
    elif original_sizes is not None:
        emu = emulate_rewrite(model, original_sizes)
    else:
        emu = emulate(model, TensorSizes(model, dims))
    if schedule:
        result = MemorySchedule(grad_accumulation=grad_accumulation, check_ahead=check_ahead)(
            emu, random_order=random_order, model_check=model_check
        )
        assert result.emulation is not None
        return OrderedGraph(result.model, result.emulation, result, list(result.pins), workarounds)
    emu, pins = keep_random_order(emu, random_order)
    return OrderedGraph(emu.model, emu, None, pins, workarounds)


# -- onnx_remat.schedule: the command's library function -------------------------------------------


@dataclass
class ScheduledModel:
    """:func:`schedule`'s result: the scheduled training graph, its estimates, and how to save it.

    The planned peaks before and after are known at once; the whole estimates
    (:attr:`estimate_before`, :attr:`estimate_after`: every step, what is alive at the peak, by
    scope) are made when first asked for, from the emulations held here (0.5 s at 10^5 nodes that
    the command, which prints the peaks alone, does not spend)."""

    model: onnx.ModelProto
    schedule: ScheduleResult
    analysis: ModelAnalysis
    original: Emulation = field(repr=False)  # the input graph's emulation

    @property
    def planned_peak_before(self) -> int:
        """The input graph's emulated planned peak (:attr:`estimate_before`'s)."""
        return self.original.planned_peak_bytes

    @property
    def planned_peak_after(self) -> int:
        """The scheduled graph's emulated planned peak (:attr:`estimate_after`'s)."""
        after = self._after_emulation
        return after.planned_peak_bytes if after is not None else self.planned_peak_before

    @functools.cached_property
    def estimate_before(self) -> MemoryEstimate:
        """The input graph's estimate (:func:`~onnx_remat.memory.estimate_emulated`)."""
        from onnx_remat.memory import estimate_emulated

        return estimate_emulated(self.analysis, self.original)

    @functools.cached_property
    def estimate_after(self) -> MemoryEstimate:
        """The scheduled graph's estimate (the input's where the schedule changed nothing)."""
        from onnx_remat.memory import estimate_emulated

        after = self._after_emulation
        return estimate_emulated(self.analysis, after) if after is not None else self.estimate_before

    @property
    def _after_emulation(self) -> Emulation | None:
        """The emulation of what is written, where it is not the input graph's."""
        result = self.schedule
        return result.emulation if result.changed and result.emulation is not None else None

    def default_output(self) -> Path:
        """Where :meth:`save` writes without a path: ``x.scheduled.onnx`` or ``<artifacts>_scheduled/``
        in the current directory (as :meth:`onnx_remat.ApplyResult.default_output`)."""
        from onnx_remat.model_io import remat_output

        src = self.analysis.source
        if src is None:
            raise RematError("the model was given in memory: give an output path")
        return remat_output(src.artifacts_dir or src.path, kind="scheduled")[0]

    def save(self, path: str | os.PathLike | None = None, *, force: bool = False) -> Path:
        """Write the result atomically, exactly as :meth:`onnx_remat.ApplyResult.save` writes a
        rewrite (an artifacts directory from one, else a model file; ``force`` to replace);
        returns where."""
        from onnx_remat.model_io import save_derived

        out = Path(path) if path is not None else self.default_output()
        return save_derived(self.analysis.source, self.model, out, force=force)

    def summary(self) -> dict:
        """JSON-ready: the model, the estimates before and after, and the schedule's choices."""
        return {
            "model": self.analysis.name,
            "planned_peak_bytes_before": self.planned_peak_before,
            "planned_peak_bytes_after": self.planned_peak_after,
            "ratio": self.planned_peak_after / self.planned_peak_before if self.planned_peak_before else None,
            **{k: v for k, v in self.schedule.summary().items() if not k.startswith("planned_peak")},
        }


@collector.pauses
def schedule(
    model: ModelLike | ModelAnalysis,
    *,
    grad_accumulation: str = DEFAULT_ACCUMULATION,
    dims: dict[str, int] | None = None,
    eval_model: str | os.PathLike | onnx.ModelProto | None = None,
) -> ScheduledModel:
    """Reorder a training graph (and accumulate its partial gradients in place) for a lower peak.

    ``model``: a training graph file, an artifacts directory, an ``onnx.ModelProto`` or its
    :class:`~onnx_remat.ModelAnalysis`. No activation is recomputed and nothing is computed
    differently (see :class:`MemorySchedule`); ``grad_accumulation="early"`` accumulates each
    partial gradient into the parameter's gradient buffer as it exists, which is bit-identical on
    a step with reset gradients but rounds differently across accumulation steps. ``dims``
    binds symbolic dimensions. The estimates before and after are the emulated planned peaks
    (:mod:`onnx_remat.estimate`). Nothing is written: call :meth:`ScheduledModel.save`.
    Raises :class:`~onnx_remat.errors.RematError` on bad input and unbound dimensions.
    """
    from onnx_remat.analysis.model import ModelAnalysis, analyze_model, runtime_judged
    from onnx_remat.memory import check_dims

    if grad_accumulation not in MODES:
        raise RematError(f"gradient accumulation must be one of {', '.join(MODES)}, not {grad_accumulation!r}")
    analysis = (
        model
        if isinstance(model, ModelAnalysis)
        # (the graphsurgeon graph and its scopes are made only if the estimates are asked for)
        else analyze_model(model, eval_model=eval_model, dims=dims, defer_load_check=True, defer_graph=True)
    )
    with runtime_judged(analysis):
        check_dims(analysis)
        original = analysis.take_emulation()
        fixed, workarounds = fix_grouped_conv_grads(analysis.model)
        given = original if fixed is analysis.model else emulate(fixed, analysis.sizes)
        # The input passed onnxruntime's load check (runtime_judged settles it before anything is
        # returned), which judges what check_runtime_support judges and more: a graph written from
        # it by moving leaves is judged with it (MemorySchedule's model_check).
        result = MemorySchedule(grad_accumulation=grad_accumulation, check_ahead=True)(
            given, random_order=original.random_order(), model_check=CheckVerdict(True) if given is original else None
        )
        if workarounds:
            result.notes.append(WORKAROUND_NOTE.format(n=len(workarounds)))
            result.chosen = result.chosen or Candidate("as given", "as written", result.planned_peak_after)
        check_scheduled(result, result.model, "scheduled model")
        return ScheduledModel(result.model, result, analysis, original)
