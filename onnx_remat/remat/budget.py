"""Recompute under a memory budget: choose what to recompute so the planned peak fits, at the least
added compute, and check the choice with the exact estimator.

>>> from onnx_remat.remat.budget import BudgetPlanner
>>> planner = BudgetPlanner(onnx_remat.analyze_model("models/artifacts/blocks10"))
>>> chosen = planner.plan(60 * 2**20)          # raises RematError if 60 MiB cannot be reached
>>> chosen.peak, chosen.added                    # exact estimated planned peak, added compute (fraction)
>>> planner.sweep()                              # the trade-off curve

``onnx_remat.apply(model, budget="60MiB")`` and ``onnx-remat apply MODEL --budget 60MiB`` call
:meth:`BudgetPlanner.plan`; ``onnx-remat plan MODEL --sweep`` calls :meth:`BudgetPlanner.sweep`.

How (each step its own module):

1. costs per node (:mod:`onnx_remat.remat.cost`: onnxruntime's profile, or a FLOP estimate) and
   ONE exact estimate of the unrewritten graph (:mod:`onnx_remat.estimate`);
2. the cheap model (:mod:`onnx_remat.remat.budget_model`): units in forward order, their options
   (store, op-level ``cheap``, child scopes, the whole layer), chains of repeated layers, and the
   memory each slot of the step needs;
3. the exact solver of that model (:mod:`onnx_remat.remat.solve`): a dynamic programme over the
   units, with rotor schedules (recompute from the nearest kept block output) inside groups of
   chained layers;
4. the plan it picks is rewritten (:mod:`onnx_remat.remat.rewrite`; a unit of a group recomputes
   from a boundary another unit's recompute made, ``Segment.from_clones``) and its planned peak
   estimated exactly. The model is approximate (onnxruntime reuses buffers by shape, and its
   memory pattern fragments), so the model is corrected where the exact estimate found it off
   (:meth:`BudgetPlanner.learn`) and solved again (a few rounds); where the corrected model picks
   a plan it has checked already that missed the budget narrowly (:data:`NEAR_MISS`), the
   model's budget is lowered by that miss and the model solved again;
5. the plans per-layer recompute (``--scope`` on every repeated layer) and
   ``--recompute-outputs`` would make are estimated too, and taken where they fit for less
   compute (so the planner never does worse than them at their own peaks).

The chosen plan's estimate is exact (byte-exact with onnxruntime's planned peak on every example
model); ``apply --measure`` runs it. A budget below the lowest peak found is refused with that
peak (:class:`~onnx_remat.errors.RematError`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import onnx

from onnx_remat.analysis.model import ModelAnalysis
from onnx_remat.analysis.regions import producer
from onnx_remat.errors import RematError
from onnx_remat.forked import Forked, beside, worth_running_beside, worth_sending_back
from onnx_remat.memory import MemoryEstimate, check_dims, estimate_emulated
from onnx_remat.ortsim.check_process import CHECK_FILE_PREFIX, CheckProcess, CheckVerdict
from onnx_remat.ortsim.emulation import Emulation
from onnx_remat.remat.budget_model import (
    LAYER,
    STORE,
    BudgetModel,
    Unit,
    build_model,
    holdings,
    layer_paths,
    ordered_unit_scopes,
)
from onnx_remat.remat.cost import NodeCosts, node_costs
from onnx_remat.remat.pipeline import RewritePipeline, begin_rewrite
from onnx_remat.remat.plan import CloneLimitExceeded, Planner, RecomputePlan, Segment, Selection, planner_of
from onnx_remat.remat.result import ApplyResult
from onnx_remat.remat.rewrite import RewriteResult, RewriteUnderway, check_not_rewritten
from onnx_remat.remat.solve import (
    Choice,
    Event,
    Problem,
    RotorStore,
    Solution,
    UnitSpec,
    least_budget,
    predict,
    solve,
)
from onnx_remat.scheduling.schedule import ScheduleResult, check_scheduled, start_check
from onnx_remat.units import format_bytes, format_bytes_apart

MAX_ROUNDS = 6  # plans checked exactly per budget before falling back to the reference plans
# A checked plan the corrected model picks again lowers the model budget by its miss of the budget,
# where the miss is at most this share of the budget (BudgetPlanner._plan_within). The stalled
# misses seen were 0.05-2.5% (resnet50 at its real size, swin_ts, synthetic chains of 200-800
# layers); 50% at 3,850 layers, where the model's quantum is above a layer's own figures.
NEAR_MISS = 0.05
PER_LAYER, RECOMPUTE_OUTPUTS, PLANNER, NONE = "per-layer", "recompute-outputs", "planner", "none"
STAGED_LIMIT = 20  # the --recompute-outputs reference is skipped when its stages clone more than this x forward


Scheduled = tuple[ScheduleResult, MemoryEstimate]  # a rewrite's memory schedule and its exact estimate
# Schedules being made in a forked child (BudgetPlanner._start_schedules): the rewrites, and their
# Scheduled pairs in that order.
Ahead = tuple[list["RewriteResult | ParkedRewrite"], Forked[list[Scheduled]]]


def makers_first(segments: list[Segment]) -> list[Segment]:
    """``segments`` in their order, except that a segment reading clones (``from_clones``) comes
    after the segments making them (whose targets they are), as the rewrite needs.

    The order given is by the first node each segment recomputes; that is not enough, because a
    rotor group's outer segment also keeps the boundaries of inner units for them, and its first
    node can come after theirs (seen: parameter Transposes that the exporter puts at the top of
    the graph). Stable and linear: a depth-first walk over the makers.
    """
    maker: dict[str, int] = {}
    for i, seg in enumerate(segments):
        for t in seg.targets:
            maker.setdefault(t.name, i)
    state = [0] * len(segments)  # 0 new, 1 on the walk, 2 placed
    out: list[Segment] = []
    for start in range(len(segments)):
        stack = [(start, iter(segments[start].from_clones))]
        while stack:
            i, pending = stack[-1]
            if state[i] == 0:
                state[i] = 1
            dep = next((maker[n] for n in pending if n in maker and state[maker[n]] == 0), None)
            if dep is not None:
                stack.append((dep, iter(segments[dep].from_clones)))
                continue
            stack.pop()
            if state[i] != 2:
                state[i] = 2
                out.append(segments[i])
    return out


class ParkedRewrite:
    """A rewrite whose model is kept as its wire bytes until it is read.

    The budget planner keeps every plan it checks, and reads few of them again (the chosen one,
    those it schedules). protobuf's Python objects take four to five times a model's wire size: a
    10^5-node rewrite is a quarter of a GiB as objects, 60 MB as bytes, and ``--budget min`` at
    10^5 nodes checks a dozen plans. The bytes go to an unnamed temporary file
    (:class:`SpilledBytes`), not the command's memory. Parked on large graphs only
    (:func:`~onnx_remat.forked.worth_running_beside`): on small ones the freed objects' memory
    was measured not to come back (GPT-2 small, ``--budget min``: 312 to 378 MiB). The copies of
    a :class:`BudgetPlan` share one ParkedRewrite (the planner's schedules are kept by it). Pickled
    (from a forked child) with its bytes."""

    def __init__(self, skeleton: RewriteResult, data: bytes | SpilledBytes) -> None:
        self.skeleton = skeleton  # the rewrite's other fields, with a placeholder model never read
        self.spilled = data if isinstance(data, SpilledBytes) else SpilledBytes(data)

    @classmethod
    def of(cls, rewrite: RewriteResult) -> ParkedRewrite:
        """``rewrite`` parked: its model serialized."""
        return cls(dataclasses.replace(rewrite, model=onnx.ModelProto()), rewrite.model.SerializeToString())

    @property
    def data(self) -> bytes:
        """The model's wire bytes (read back at each call)."""
        return self.spilled.read()

    @property
    def clone_count(self) -> int:
        return self.skeleton.clone_count

    def read(self) -> RewriteResult:
        """The rewrite, its model parsed from the bytes (a new one at each call: what reads it
        holds it only as long as it needs it; 0.1 s at 10^5 nodes)."""
        model = onnx.ModelProto()
        model.ParseFromString(self.data)
        return dataclasses.replace(self.skeleton, model=model)

    def __getstate__(self) -> tuple[RewriteResult, bytes]:
        return self.skeleton, self.data

    def __setstate__(self, state: tuple[RewriteResult, bytes]) -> None:
        self.skeleton, data = state
        self.spilled = SpilledBytes(data)


class SpilledBytes:
    """Bytes kept in an unnamed temporary file rather than in memory (in memory where the file
    cannot be written). The file has no name and goes when this object does, or with the
    process; forked children read it with ``pread``, which moves no shared offset. Where the
    temporary directory is a RAM disk (tmpfs) the bytes are still in RAM, only not in the
    command's resident set."""

    def __init__(self, data: bytes) -> None:
        self.size = len(data)
        self._kept: bytes | None = None
        try:
            self._file: IO[bytes] | None = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as this object)
            self._file.write(data)
            self._file.flush()
        except OSError:  # no room or no temporary directory: kept in memory, as before
            self._file = None
            self._kept = data

    def read(self) -> bytes:
        """The bytes."""
        if self._file is None:
            assert self._kept is not None
            return self._kept
        fd, parts, done = self._file.fileno(), [], 0
        while done < self.size:
            part = os.pread(fd, self.size - done, done)
            if not part:
                raise OSError(f"temporary file truncated at {done} of {self.size} bytes")
            parts.append(part)
            done += len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)


@dataclass
class BudgetPlan:
    """One plan and its exact figures.

    ``peak`` is the exact estimated planned peak (what onnxruntime plans); ``cost`` the seconds
    its clones add per step, ``total`` the step (:class:`~onnx_remat.remat.cost.NodeCosts`), so
    ``added`` is the fraction of compute added. ``rewrite`` is None for the unrewritten graph.
    """

    source: str  # planner, per-layer, recompute-outputs or none
    plan: RecomputePlan | None
    _rewrite: RewriteResult | ParkedRewrite | None  # read it as ``rewrite``
    estimate: object  # MemoryEstimate
    cost: float
    total: float
    choices: list[str] = field(default_factory=list)  # what each unit or group does, readable
    model_budget: int | None = None  # the budget the model was solved for
    solution: Solution | None = None  # the model's solution it realizes (None for a reference without one)
    observed: dict = field(default_factory=dict)  # live bytes per slot in its exact estimate
    # The rewrite after the memory schedule and its exact estimate, where the planner scheduled it
    # (BudgetPlanner(schedule=True): the reference plans, checked against budgets scheduled).
    scheduled: Any = None  # ScheduleResult
    scheduled_estimate: Any = None  # MemoryEstimate

    @property
    def rewrite(self) -> RewriteResult | None:
        """The plan's rewrite (None for the unrewritten graph); where the planner parked its model
        (:class:`ParkedRewrite`), read back from its bytes at each call."""
        r = self._rewrite
        return r.read() if isinstance(r, ParkedRewrite) else r

    @property
    def peak(self) -> int:
        return int(self.estimate.planned_peak_bytes)  # type: ignore[attr-defined]

    @property
    def written_peak(self) -> int:
        """The peak of what apply writes: the scheduled rewrite's where it is lower."""
        if self.scheduled_estimate is None:
            return self.peak
        return min(self.peak, int(self.scheduled_estimate.planned_peak_bytes))

    @property
    def added(self) -> float:
        return self.cost / self.total if self.total else 0.0

    @property
    def clones(self) -> int:
        return self._rewrite.clone_count if self._rewrite is not None else 0  # (no parked model read)

    def summary(self) -> dict:
        """JSON-ready figures."""
        return {
            "source": self.source,
            "planned_peak_bytes": self.written_peak,  # scheduled, where the planner scheduled it
            "planned_peak_bytes_unscheduled": self.peak,
            "added_compute": self.added,
            "added_seconds": self.cost,
            "step_seconds": self.total,
            "segments": len(self.plan.segments) if self.plan is not None else 0,
            "cloned_nodes": self.clones,
            "choices": self.choices,
            "model_budget_bytes": self.model_budget,
        }


def _holds(ahead: Ahead, rewrite: RewriteResult | ParkedRewrite) -> bool:
    """Whether schedules made ahead include ``rewrite``'s."""
    return any(r is rewrite for r in ahead[0])


def portable(bp: BudgetPlan) -> BudgetPlan:
    """``bp`` without its plan, and its rewrite's segments naming their plan's segments by index:
    what a forked child sends back (the plan's segments hold the analysed graph's nodes, which the
    parent has). :func:`restored` puts them back."""
    assert bp.plan is not None and bp._rewrite is not None
    plan = bp.plan
    return dataclasses.replace(bp, plan=None, _rewrite=_with_segments(bp._rewrite, lambda r: r.segments_by_index(plan)))


def restored(bp: BudgetPlan, plan: RecomputePlan) -> BudgetPlan:
    """A :func:`portable` plan made whole again with ``plan``, the plan it was evaluated on."""
    assert bp._rewrite is not None
    return dataclasses.replace(bp, plan=plan, _rewrite=_with_segments(bp._rewrite, lambda r: r.segments_of(plan)))


def _with_segments(
    rewrite: RewriteResult | ParkedRewrite, change: Callable[[RewriteResult], RewriteResult]
) -> RewriteResult | ParkedRewrite:
    """``change(rewrite)``, for a parked rewrite on its skeleton (the model stays parked)."""
    if isinstance(rewrite, ParkedRewrite):
        return ParkedRewrite(change(rewrite.skeleton), rewrite.spilled)
    return change(rewrite)


@dataclass
class Attempt:
    """One round of the calibration: the model's budget, and what the exact estimate said."""

    model_budget: int
    peak: int | None
    cost: float | None
    fits: bool


@dataclass
class BudgetResult:
    """:meth:`BudgetPlanner.plan`'s answer: the chosen plan, the baseline, and how it was found."""

    budget: int
    chosen: BudgetPlan
    baseline_peak: int
    attempts: list[Attempt]
    references: list[BudgetPlan]
    notes: list[str] = field(default_factory=list)
    written_peak: int | None = None  # estimated planned peak of the graph apply writes (scheduled)

    @property
    def planned_peak(self) -> int:
        """The estimated planned peak of what is written: the scheduled rewrite where apply
        scheduled it, else the chosen plan's."""
        return self.written_peak if self.written_peak is not None else self.chosen.written_peak

    def summary(self) -> dict:
        return {
            "budget_bytes": self.budget,
            "planned_peak_bytes": self.planned_peak,
            "baseline_planned_peak_bytes": self.baseline_peak,
            "chosen": self.chosen.summary(),
            "attempts": [dataclasses.asdict(a) for a in self.attempts],
            "references": [r.summary() for r in self.references],
            "notes": self.notes,
        }


@dataclass
class SweepPoint:
    budget: int
    plan: BudgetPlan | None  # None: unreachable


@dataclass
class Sweep:
    """The trade-off curve: per budget the chosen plan, plus the reference plans and the floor."""

    baseline_peak: int
    total: float
    points: list[SweepPoint]
    references: list[BudgetPlan]
    floor: BudgetPlan
    cost_source: str

    def to_json(self) -> dict:
        return {
            "baseline_planned_peak_bytes": self.baseline_peak,
            "step_seconds": self.total,
            "cost_source": self.cost_source,
            "floor": self.floor.summary(),
            "points": [
                {"budget_bytes": p.budget, **(p.plan.summary() if p.plan else {"planned_peak_bytes": None})}
                for p in self.points
            ],
            "references": [r.summary() for r in self.references],
        }


def _solution_key(sol: Solution) -> str:
    return repr(
        [(c.first, c.last, c.option, [(e.unit, e.start, e.from_clone, e.holds) for e in c.events]) for c in sol.choices]
    )


def to_problem(model: BudgetModel, max_group: int = 12, fix: dict | None = None) -> Problem:
    """The numbers :func:`onnx_remat.remat.solve.solve` works on, with the corrections ``fix``
    learnt from exact estimates (keyed as :func:`~onnx_remat.remat.solve.predict` names figures)."""
    fix = fix or {}
    specs = []
    for u in model.units:
        k = u.index
        opts = [
            (o.cost, o.need(u) + fix.get(("bw", k, i), 0), o.kept + fix.get(("kept", k, i), 0))
            for i, o in enumerate(u.options)
        ]
        layer = u.option(LAYER)
        layer_spec = None
        input_extra = 0
        first_need = last_need = None
        if layer is not None:
            single = fix.get(("bw", k, u.options.index(layer)), 0)
            # inside a group the unit's input is the previous unit's boundary, held by the group's
            # schedule: what the unit alone keeps alive for it does not count here
            prev = model.units[k - 1] if k > 0 and model.units[k - 1].joins_next else None
            input_extra = min(layer.extra, prev.hold_bytes) if prev is not None else 0
            kept = layer.kept - input_extra + fix.get(("gkept", k), fix.get(("kept", k, u.options.index(layer)), 0))
            inner = fix.get(("bw", k, -1), single)
            layer_spec = (layer.cost, layer.need(u) + inner, kept)
            first_need = layer.need(u) + fix.get(("bw", k, -2), inner)
            last_need = layer.need(u) + fix.get(("bw", k, -3), inner)
        specs.append(
            UnitSpec(
                fw_need=u.fw_need + fix.get(("fw", k), 0),
                boundary=u.boundary_bytes,
                options=opts,
                joins_next=u.joins_next,
                layer=layer_spec,
                forward_cost=u.forward_cost,
                advance=u.advance,
                event_ext=u.event_ext + fix.get(("adv", k), 0),
                hold=u.hold_bytes,
                input_extra=input_extra if layer is not None else 0,
                first_need=first_need,
                last_need=last_need,
            )
        )
    return Problem(
        specs, mid_need=model.mid_need + fix.get(("mid",), 0), outside_need=model.outside_need, max_group=max_group
    )


@dataclass
class _EarlyReference:
    """The per-layer reference plan of ``paths`` made by the planner's set-up (None: it recomputes
    nothing) with the planner that made it, and its rewrite begun (None: no plan)."""

    paths: list[str]
    plan: RecomputePlan | None
    planner: Planner
    underway: RewriteUnderway | None


class BudgetPlanner:
    """Plans for memory budgets on one analysed training graph (see the module docstring).

    ``costs``: per-node costs (default :func:`~onnx_remat.remat.cost.node_costs`: the cached
    profile beside the model, else the FLOP estimate); ``profile`` a profile file to read them
    from; ``dropout`` is passed to the planner of segments; ``max_group`` bounds the units one
    rotor group spans. With ``schedule`` the reference plans (per-layer, ``--recompute-outputs``)
    and the floor's candidates are also scheduled as ``apply`` would write them, and fit a budget
    when their scheduled peak does: a budget per-layer recompute reaches only after the schedule
    gets per-layer, not a refusal or a dearer plan, and refusals name the scheduled floor. The
    planner's own rounds are solved and checked on unscheduled figures.
    """

    def __init__(
        self,
        analysis: ModelAnalysis,
        *,
        costs: NodeCosts | None = None,
        profile=None,
        dropout: str | None = None,
        max_group: int = 12,
        schedule: bool = False,
        grad_accumulation: str = "inplace",
    ):
        check_not_rewritten(analysis.graph)
        check_dims(analysis)
        self.analysis = analysis
        self.reference_notes: list[str] = []  # why a reference plan was not made
        # The units read the analysis alone, and so does the per-layer reference plan (the first
        # plan a budget evaluates): on a large graph it is planned now, by a planner of its own, and
        # its rewrite started in a forked child, which runs beside this set-up (the input's
        # emulation, its estimate and the model: 5 s at 10^5 nodes) rather than after it. A plan
        # decides which dropout masks later segments keep as bytes: the model's planner takes that
        # over where the reference is taken (_per_layer_reference), as if it had made the plan then.
        ordered = ordered_unit_scopes(analysis)
        self._early: _EarlyReference | None = None
        if worth_sending_back(analysis.model) and (paths := layer_paths(ordered)):
            planner = planner_of(analysis, dropout)
            early = self._reference_plan(paths, merged=False, planner=planner)
            underway = begin_rewrite(analysis, early) if early is not None else None
            self._early = _EarlyReference(paths, early, planner, underway)
        # The costs read the analysis alone: on a large graph they are made beside the emulation.
        pending = (
            Forked.done(costs)
            if costs is not None
            else beside(lambda: node_costs(analysis, profile), len(analysis.model.graph.node))
        )
        with pending:
            original = analysis.take_emulation()
            self.baseline = estimate_emulated(analysis, original)
            self.costs = pending.result()
        self.baseline_parts = (self.baseline, original.plan, original.rg)
        # the planner's rounds are checked unscheduled; its reference plans and the floor as apply writes them
        self.pipeline = RewritePipeline(analysis, original, schedule=False, grad_accumulation=grad_accumulation)
        self.model = build_model(analysis, self.costs, self.baseline_parts, dropout=dropout, ordered=ordered)
        self.max_group = max_group
        self.fix: dict[tuple, int] = {}  # corrections learnt from exact estimates (see learn())
        self.dropout = dropout
        self.schedule = schedule
        self.grad_accumulation = grad_accumulation
        _est, mplan, rg = self.baseline_parts
        self._base_step: dict[str, int] = {}
        for k, i in enumerate(mplan.order):
            for name in rg.at(i).origin:
                self._base_step.setdefault(name, k)
        self._references: list[BudgetPlan] | None = None
        self._reference_fix: dict[tuple, int] = {}
        self._base_observed: dict | None = None  # _baseline_observed
        self._floor: BudgetPlan | None = None
        # A solution is rewritten and emulated once per planner: the floor's candidates, the rounds of
        # every budget and the references repeat plans (the same solution at several model budgets).
        self._realized: dict[tuple[str, str], BudgetPlan] = {}
        # by id(rewrite): the plans' rewrites, parked or not (a BudgetPlan's copies share it)
        self._schedules: dict[int, tuple[RewriteResult | ParkedRewrite, ScheduleResult, MemoryEstimate]] = {}
        # Schedules being made in a forked child, ahead of need (_schedule_ahead): the rewrites, and
        # their (schedule, estimate) pairs in that order.
        self._ahead: Ahead | None = None
        self._rotors = RotorStore()  # a budget's rounds solve it again with a few units corrected
        # The emulation of one plan evaluated, with that plan (its rewrite parked or not): apply
        # schedules the chosen plan, and its schedule starts from this emulation where it is that
        # plan's, rather than emulating and planning the rewrite again (a third of the schedule).
        # One at a time: the cheapest plan evaluated that fits the budget being planned (_budget),
        # else the latest; on a large graph only until the next plan is evaluated (_keeps_kept).
        self._kept: tuple[BudgetPlan, Emulation] | None = None
        self._budget: int | None = None
        # The schedule of the plan the rounds would choose now, made ahead in a forked child
        # (_schedule_chosen_ahead), while plan() runs for a caller that schedules its choice.
        self._chosen_ahead: Ahead | None = None  # (of one rewrite)
        self._speculate = False

    @property
    def units(self) -> list[Unit]:
        return self.model.units

    @property
    def problem(self) -> Problem:
        """The solver's problem, with the corrections learnt so far."""
        return to_problem(self.model, self.max_group, self.fix)

    @property
    def baseline_peak(self) -> int:
        return int(self.baseline.planned_peak_bytes)

    # -- turning a solution into a plan ---------------------------------------------------------

    def _event_segment(self, ev: Event) -> Segment:
        """The segment of one rotor event: forward from the boundary of unit ``ev.start`` through
        the units up to ``ev.unit``, keeping the boundaries of ``ev.holds`` and the unit's own
        recomputed activations for the backward pass."""
        p = self.model.planner
        units = self.units
        unit = units[ev.unit]
        layer = unit.option(LAYER)
        assert layer is not None
        targets = [t for s in layer.segments for t in s.targets]
        for h in ev.holds:
            targets += units[h].boundary
        nodes = [n for k in range(ev.start + 1, ev.unit + 1) for n in units[k].nodes]
        candidates, _, _ = p._scope_candidates(nodes)
        allowed = set(candidates) | {id(n) for s in layer.segments for n in s.recompute}
        label = unit.path if ev.start == ev.unit - 1 and not ev.holds else f"{unit.path}<{units[ev.start].path}"
        paths = [units[k].path for k in range(ev.start + 1, ev.unit + 1)]
        seg = p._segment(label, "scope", paths, targets, lambda n: id(n) in allowed, [])
        assert seg is not None
        if ev.from_clone and ev.start >= 0:
            seg.from_clones = [t.name for t in units[ev.start].boundary]
        seg.group = f"{units[min(ev.start + 1, ev.unit)].path}..{unit.path}" if ev.holds or ev.from_clone else None
        p._account(seg)
        if ev.from_clone:
            # the start boundary is read from a clone: it is not stored, nothing is kept alive for it
            held = sum(p.sizes.nbytes(t.name) or 0 for t in units[ev.start].boundary)
            seg.extra_boundary_bytes = max(0, seg.extra_boundary_bytes - held)
            seg.released_bytes = seg.target_bytes - seg.extra_boundary_bytes
        return seg

    def _describe(self, c: Choice) -> str:
        units = self.units
        if c.option is not None:
            return f"{units[c.first].path}: {units[c.first].options[c.option].kind}"
        parts = []
        for ev in c.events:
            src = "input" if ev.start == c.first - 1 and not ev.from_clone else units[ev.start].path
            keeps = f", keeps {', '.join(units[h].path for h in ev.holds)}" if ev.holds else ""
            parts.append(f"{units[ev.unit].path} from {src}{keeps}")
        return f"{units[c.first].path}..{units[c.last].path}: rotor group ({'; '.join(parts)})"

    def realize(self, sol: Solution, source: str = PLANNER) -> BudgetPlan:
        """Rewrite and estimate a solution of the model: once per distinct solution (its segments
        depend on the solution alone), each call getting its own :class:`BudgetPlan` (callers set its
        ``model_budget`` and schedule)."""
        key = (source, _solution_key(sol))
        done = self._realized.get(key)
        if done is None:
            done = self._realized[key] = self._realize(sol, source)
        return dataclasses.replace(done, choices=list(done.choices), solution=sol)

    def _realize(self, sol: Solution, source: str) -> BudgetPlan:
        segments: list[Segment] = []
        owners: dict[int, int] = {}
        for c in sol.choices:
            if c.option is not None:
                for seg in self.units[c.first].options[c.option].segments:
                    segments.append(seg)
                    owners[id(seg)] = c.first
            else:
                for ev in c.events:
                    seg = self._event_segment(ev)
                    segments.append(seg)
                    owners[id(seg)] = ev.unit
        choices = [self._describe(c) for c in sol.choices if not self._is_store(c)]
        bp = self._evaluate(segments, source, choices, owners=owners)
        bp.solution = sol
        return bp

    def _is_store(self, c: Choice) -> bool:
        return c.option is not None and self.units[c.first].options[c.option].kind == STORE

    def _evaluate(
        self, segments: list[Segment], source: str, choices: list[str], notes=(), owners: dict | None = None
    ) -> BudgetPlan:
        if not segments:
            bp = BudgetPlan(NONE, None, None, self.baseline, 0.0, self.costs.total, [])
            # What the model learns from the unrewritten graph's own estimate: a model that takes
            # the graph to fit a budget it does not meet would otherwise choose it again, and the
            # rounds stop at the first (seen on dynamo exports of decoders: the reference plans were
            # taken at 25% added compute where a plan of 5% fits).
            bp.observed = self._baseline_observed()
            return bp
        pos = self.analysis.graph.position
        segments = makers_first(sorted(segments, key=lambda s: min(pos[id(producer(t))] for t in s.targets)))
        made: set[str] = set()
        for s in segments:  # a segment reading clones comes after the one making them
            missing = [n for n in s.from_clones if n not in made]
            if missing:
                raise AssertionError(f"segment {s.label} reads clones of {missing[:2]} before they are made")
            made.update(t.name for t in s.targets)
        plan = self._plan(segments, list(notes))
        return self._evaluate_plan(plan, source, choices, owners)

    def _plan(self, segments: list[Segment], notes: list[str]) -> RecomputePlan:
        extra: dict = {"dropout": self.dropout} if self.dropout is not None else {}
        sizes = self.analysis.sizes
        mask_shapes = {t.name: sizes.raw_dims(t.name) for s in segments for t in s.masks}
        return RecomputePlan(segments=segments, notes=notes, mask_shapes=mask_shapes, **extra)

    # -- references -----------------------------------------------------------------------------

    def references(self) -> list[BudgetPlan]:
        """Per-layer recompute (every repeated layer unit, as ``--scope``) and the same with
        ``--recompute-outputs``, estimated exactly."""
        if self._references is None:
            paths = [u.path for u in self.units if u.chain is not None]
            refs = []
            for merged, bp in self._reference_plans(paths) if paths else []:
                bp.solution = self._reference_solution(merged)
                if bp.solution is not None:
                    self.learn(bp)
                refs.append(bp)
            self._references = refs
            self._reference_fix = dict(self.fix)
        return self._references

    def _reference_plans(self, paths: list[str]) -> list[tuple[bool, BudgetPlan]]:
        """The reference plans over the layer units ``paths``, each evaluated (a whole pipeline run:
        11 s at 10^5 nodes), per-layer first; each with whether it is ``--recompute-outputs``.

        On a large graph (:func:`~onnx_remat.forked.worth_running_beside`) the ``--recompute-outputs``
        reference is planned and evaluated in a forked child (:class:`onnx_remat.forked.Forked`) while
        this process evaluates per-layer, and comes back as :func:`portable` makes it; its plan is then
        made again here, where the graph's own nodes are. Its planning alone took 2.9 s at 10^5 nodes
        (3,850 layers), where the planner stops at the clone limit and the reference is not made.
        Not where the graph's own bytes (its weights, inside the model) would make the rewrite too
        heavy to send back."""
        per_layer, underway = self._per_layer_reference(paths)
        if not worth_sending_back(self.analysis.model):
            merged = self._reference_plan(paths, merged=True)
            return [
                (m, self._evaluate_reference(plan, m))
                for m, plan in ((False, per_layer), (True, merged))
                if plan is not None
            ]

        def merged_in_child() -> tuple[list[str], list[str] | None, BudgetPlan | None]:
            noted = len(self.reference_notes)
            plan = self._reference_plan(paths, merged=True)
            notes = self.reference_notes[noted:]
            if plan is None:
                return notes, None, None
            return notes, [s.label for s in plan.segments], portable(self._evaluate_reference(plan, True))

        with Forked.start(merged_in_child) as child:
            done = [(False, self._evaluate_reference(per_layer, False, underway))] if per_layer is not None else []
            notes, labels, evaluated = child.result()
        self.reference_notes += notes
        if evaluated is not None:
            # the child's plan names the child's objects: the same plan is made again here
            # (the planner is deterministic, and nothing it reads changed since the fork)
            plan = self._reference_plan(paths, merged=True)
            if plan is None or [s.label for s in plan.segments] != labels:
                raise RuntimeError("the --recompute-outputs reference planned differently in the forked child")
            done.append((True, restored(evaluated, plan)))
        return done

    def _per_layer_reference(self, paths: list[str]) -> tuple[RecomputePlan | None, RewriteUnderway | None]:
        """The per-layer reference plan of ``paths`` (:meth:`_reference_plan`) and its rewrite where
        it was begun already: the plan and the rewrite the set-up started for the same layers (the
        same plan, made then), else the plan made now."""
        early, self._early = self._early, None
        if early is not None and early.paths == paths:
            self.model.planner.keep_masks_as_bytes(early.planner.masks_kept_as_bytes)
            return early.plan, early.underway
        if early is not None and early.underway is not None:
            early.underway.cancel()
        return self._reference_plan(paths, merged=False), None

    def _cancel_early(self) -> None:
        """Stop the per-layer reference's rewrite begun by the set-up, where no budget will read it."""
        early, self._early = self._early, None
        if early is not None and early.underway is not None:
            early.underway.cancel()

    def _reference_plan(
        self, paths: list[str], *, merged: bool, planner: Planner | None = None
    ) -> RecomputePlan | None:
        """Per-layer (``merged`` False) or ``--recompute-outputs`` recompute of ``paths``; None where
        it recomputes nothing, or (with a note in ``reference_notes``) would clone too much.
        ``planner``: the model's (:func:`~onnx_remat.remat.plan.planner_of`), before the
        model is made."""
        if planner is None:
            planner = self.model.planner
        # Staged recompute of a long chain clones O(layers^2) nodes (700 layers: 245,000 block
        # recomputes): not worth a reference, and not linear, so the planner stops building it
        # once past the limit.
        limit = STAGED_LIMIT * len(self.analysis.graph.forward_nodes) if merged else None
        try:
            plan = planner.plan(Selection(scopes=paths, recompute_outputs=merged), clone_limit=limit)
        except CloneLimitExceeded:
            self.reference_notes.append(
                f"{RECOMPUTE_OUTPUTS} not estimated as a reference: its stages would clone more "
                f"than {STAGED_LIMIT} times the forward pass ({len(paths)} layers in a chain)"
            )
            return None
        except RematError:
            return None
        return plan if plan.segments else None

    def _evaluate_reference(
        self, plan: RecomputePlan, merged: bool, underway: RewriteUnderway | None = None
    ) -> BudgetPlan:
        source = RECOMPUTE_OUTPUTS if merged else PER_LAYER
        return self._evaluate_plan(plan, source, [f"--scope on every repeated layer ({source})"], underway=underway)

    def _evaluate_plan(
        self,
        plan: RecomputePlan,
        source: str,
        choices: list[str],
        owners=None,
        *,
        underway: RewriteUnderway | None = None,
    ) -> BudgetPlan:
        if not self._keeps_kept(None):
            self._kept = None  # (let go before the next rewrite and its emulation are made)
        done = self.pipeline.run(plan, underway=underway)
        emu = done.ordered.emulation
        assert emu is not None and done.estimate is not None
        # The plan's graph is the rewrite as ordered: random ops pinned where it reorders them.
        rewrite = dataclasses.replace(done.rewrite, model=done.ordered.model)
        parts = (done.estimate, emu.plan, emu.rg)
        cost = sum(self.costs.recompute_sum(s.recompute) for s in plan.segments)
        bp = BudgetPlan(source, plan, rewrite, parts[0], cost, self.costs.total, choices)
        bp.observed = self._observe(parts, rewrite, plan, owners)
        if worth_running_beside(len(rewrite.model.graph.node)):
            del parts, done
            bp._rewrite = ParkedRewrite.of(rewrite)
        if not self._keeps_kept(bp):
            self._kept = (bp, emu)
        return bp

    def _keeps_kept(self, new: BudgetPlan | None) -> bool:
        """Whether the kept emulation stays rather than ``new``'s (None: a plan about to be
        evaluated): while its plan fits the budget being planned and ``new`` is not a cheaper fit.
        On a large graph (:func:`~onnx_remat.forked.worth_running_beside`) it never stays beside
        the next plan's evaluation: an emulation and the model it holds are 0.4 GiB at 10^5 nodes,
        and the command's peak would hold two (pickled to a file instead, it took 4 of the 6 s it
        saves to write and read back)."""
        kept = self._kept
        if kept is None or self._budget is None or kept[0].peak > self._budget:
            return False
        if new is None:
            return not worth_running_beside(len(self.analysis.model.graph.node))
        return new.peak > self._budget or new.cost >= kept[0].cost

    def _baseline_observed(self) -> dict:
        """:meth:`_observe` of the unrewritten graph (empty once :meth:`release_planning` let its
        plan go), made once."""
        if self._base_observed is None:
            if self.baseline_parts[1] is None:
                return {}
            self._base_observed = self._observe(self.baseline_parts, None, None, None)
        return self._base_observed

    def _observe(
        self, parts, rewrite: RewriteResult | None, plan: RecomputePlan | None, owners: dict | None
    ) -> dict[str, int]:
        """Live bytes at most per slot of the baseline (``fw:k``, ``bw:k``, ``mid``, ...) in the
        exact estimate of a rewrite: clones and barriers count in the backward slot of the unit
        they recompute, original nodes in their slot of the unrewritten graph."""
        est, mplan, rg = parts
        unit_of_node = {n.name: u.index for u in self.units for n in u.nodes if n.name}
        step_slot = self.model.slots
        base_step = self._base_step
        owner_of: dict[str, int] = {}
        pairs = zip(plan.segments, rewrite.segments) if plan is not None and rewrite is not None else ()
        for seg, rs in pairs:
            k = owners.get(id(seg)) if owners else None
            if k is None:
                k = next(
                    (
                        unit_of_node[t.inputs[0].name]
                        for t in seg.targets
                        if t.inputs and t.inputs[0].name in unit_of_node
                    ),
                    None,
                )
            if k is None:
                continue
            for name in [rs.barrier or "", *rs.clones, *getattr(rs, "unpacked", [])]:
                owner_of[name] = k
        observed: dict = {}
        slot = peak_slot = "pre"
        mid_step = None
        for k, i in enumerate(mplan.order):
            origin = rg.at(i).origin
            mine = [owner_of[o] for o in origin if o in owner_of]
            if mine:
                slot = f"bw:{mine[0]}"
            else:
                steps = [base_step[o] for o in origin if o in base_step]
                if steps:
                    slot = step_slot[min(steps)]
            live = int(mplan.live_bytes[k])
            if live > observed.get(slot, -1):
                observed[slot] = live
            if slot == "mid" and mid_step is None:
                mid_step = k
            if k == mplan.block_peak_step:
                peak_slot = slot
        # onnxruntime's block reaches its final size (the planned peak) in one slot: fragmentation
        # (free gaps too small to reuse) counts there, so the model learns the planned peak itself
        observed[peak_slot] = max(observed.get(peak_slot, 0), int(est.planned_peak_bytes))
        if mid_step is not None:
            held: dict[int, int] = {}
            for unit, start, end, size in holdings(mplan, self.model.unit_of_tensor):
                if start <= mid_step <= end:
                    held[unit] = held.get(unit, 0) + size
            observed["_held"] = held
        return observed

    def learn(self, bp: BudgetPlan, *, raise_only: bool = False) -> None:
        """Correct the model where it was off for this plan: per slot, the exact estimate's live
        bytes minus the model's, added to the figure that decided the slot (repeated while another
        figure of the slot takes over). The latest plan's figures win: the model is local."""
        if bp.solution is None or not bp.observed:
            return
        held = bp.observed.get("_held")
        if held is not None:
            # what each unit stores past the forward pass, read off the rewrite's estimate
            problem = self.problem
            for c in bp.solution.choices:
                for k in range(c.first, c.last + 1):
                    spec = problem.units[k]
                    if c.option is not None:
                        key: tuple = ("kept", k, c.option)
                        model = spec.options[c.option][2] + spec.boundary
                    else:
                        key = ("gkept", k)
                        model = spec.layer[2] + (spec.boundary if k == c.last else 0)  # type: ignore[index]
                        model += spec.input_extra if k == c.first else 0
                        if key not in self.fix:
                            layer = self.units[k].option(LAYER)
                            self.fix[key] = self.fix.get(("kept", k, self.units[k].options.index(layer)), 0)  # type: ignore[arg-type]
                    if not raise_only or held.get(k, 0) > model:
                        self.fix[key] = self.fix.get(key, 0) + held.get(k, 0) - model
        for _ in range(4):
            changed = False
            for slot, (value, key) in predict(self.problem, bp.solution).items():
                seen = bp.observed.get(slot)
                if seen is None or seen == value:
                    continue
                if raise_only and seen < value:
                    continue
                if key[0] == "bw" and key[2] < 0 and key not in self.fix:
                    u = self.units[key[1]]
                    layer = u.option(LAYER)
                    single = self.fix.get(("bw", key[1], u.options.index(layer)), 0) if layer is not None else 0
                    self.fix[key] = self.fix.get(("bw", key[1], -1), single) if key[2] < -1 else single
                self.fix[key] = self.fix.get(key, 0) + (seen - value)
                changed = True
            if not changed:
                break

    def _reference_solution(self, merged: bool) -> Solution | None:
        """The reference plan as a solution of the model (to learn from its estimate)."""
        units = self.units
        choices: list[Choice] = []
        k = 0
        while k < len(units):
            u = units[k]
            layer = u.option(LAYER)
            if u.chain is None or layer is None:
                choices.append(Choice(k, k, option=0))
                k += 1
                continue
            if not merged:
                choices.append(Choice(k, k, option=u.options.index(layer)))
                k += 1
                continue
            b = k
            while b + 1 < len(units) and units[b].joins_next and units[b + 1].option(LAYER) is not None:
                b += 1
            if b == k:
                choices.append(Choice(k, k, option=u.options.index(layer)))
            else:
                events = [Event(m, k - 1, False, [m - 1] if m > k else []) for m in range(b, k - 1, -1)]
                choices.append(Choice(k, b, events=events))
            k = b + 1
        return Solution(cost=0.0, choices=choices, stored=0, budget=0)

    # -- budgets -------------------------------------------------------------------------------

    def _fits(self, bp: BudgetPlan, budget: int) -> bool:
        """Whether ``bp`` fits ``budget`` as apply writes it: scheduled (a reference plan, with
        ``schedule``; computed once) or not."""
        if bp.peak <= budget:
            return True
        if not self.schedule or bp._rewrite is None or bp.scheduled is not None:
            return bp.written_peak <= budget
        bp.scheduled, bp.scheduled_estimate = self.scheduled(bp._rewrite)
        return bp.written_peak <= budget

    def release_planning(self, keep: RewriteResult | ParkedRewrite | None = None) -> None:
        """Let go of what only planning reads (the original's emulated plan and graph, the budget
        model, the plans realized and the schedules made, but ``keep``'s): after :meth:`plan`,
        before the chosen rewrite is scheduled (:meth:`scheduled` still works). At 10^5 nodes they
        held a quarter of a GiB under the final schedule, the command's peak."""
        self.baseline_parts = (self.baseline, None, None)  # type: ignore[assignment]
        self.model = None  # type: ignore[assignment]
        self._base_step = {}
        self._realized = {}
        self._references = None
        self._floor = None
        self._rotors = RotorStore()
        self._schedules = {k: v for k, v in self._schedules.items() if keep is not None and v[0] is keep}
        if self._kept is not None and (keep is None or self._kept[0]._rewrite is not keep):
            self._kept = None
        self._stop_chosen_ahead(unless=keep)

    def scheduled(self, rewrite: RewriteResult | ParkedRewrite, *, check_ahead: bool = False) -> Scheduled:
        """The memory schedule of a plan's rewrite (as ``apply`` writes it; parked or not) and its
        exact estimate; computed once per rewrite (the floor's candidates are scheduled, and
        ``apply`` schedules the chosen plan, often one of them). ``check_ahead``: where it is made
        now, the schedule starts the written graph's validity check beside its emulation
        (``ScheduleResult.checking``; apply takes it)."""
        for slot in ("_chosen_ahead", "_ahead"):
            ahead: Ahead | None = getattr(self, slot)
            if ahead is not None and _holds(ahead, rewrite):
                setattr(self, slot, None)
                rewrites, pending = ahead
                for r, (sched, est) in zip(rewrites, pending.result()):
                    self._schedules[id(r)] = (r, sched, est)
        done = self._schedules.get(id(rewrite))
        if done is not None and done[0] is rewrite:
            sched = done[1]
            if check_ahead and sched.checking is None:
                # made earlier (or ahead, in a child): the check of the graph it writes starts now
                sched.checking = start_check(sched.model)
            return sched, done[2]
        sched, est = self._schedule(rewrite, check_ahead=check_ahead)
        self._schedules[id(rewrite)] = (rewrite, sched, est)
        return sched, est

    def _schedule(self, rewrite: RewriteResult | ParkedRewrite, *, check_ahead: bool = False) -> Scheduled:
        """The schedule of ``rewrite`` and its estimate; the schedule without its emulation (a
        quarter to half a GiB at 10^5 nodes, and the floor schedules up to six plans, each kept):
        what is read of it later is its model and figures. The rewrite's emulation is the one its
        evaluation made where that is the one kept (:meth:`_keeps_kept`; then taken: it is not
        kept twice)."""
        kept = self._kept
        if kept is not None and kept[0]._rewrite is rewrite:
            self._kept = None
            emulated = kept[1]
            del kept
            ordered = self.pipeline.order(emulated.model, schedule=True, check_ahead=check_ahead, emulated=emulated)
            del emulated
        else:
            del kept
            if worth_running_beside(len(self.analysis.model.graph.node)):
                self._kept = None  # (on a large graph, not held beside this rewrite's emulation)
            model = rewrite.read().model if isinstance(rewrite, ParkedRewrite) else rewrite.model
            ordered = self.pipeline.order(model, schedule=True, check_ahead=check_ahead)
            del model
        assert ordered.schedule is not None and ordered.emulation is not None
        estimate = estimate_emulated(self.analysis, ordered.emulation)
        ordered.schedule.emulation = None
        return ordered.schedule, estimate

    def _schedule_ahead(self, rewrites: list[RewriteResult | ParkedRewrite]) -> None:
        """Start the schedules of ``rewrites`` in a forked child, on a large graph, for
        :meth:`scheduled` to take when they are asked for: a reference plan above the budget is
        scheduled once the budget's rounds are done (14 s at 10^5 nodes), and nothing in the rounds
        changes what its schedule is. Any not taken are dropped by :meth:`_drop_ahead`."""
        self._drop_ahead()
        rewrites = [r for r in rewrites if id(r) not in self._schedules]
        if not rewrites or not worth_running_beside(len(self.analysis.model.graph.node)):
            return
        self._ahead = self._start_schedules(rewrites)

    def _start_schedules(self, rewrites: list[RewriteResult | ParkedRewrite], *, check: bool = False) -> Ahead:
        """The schedules of ``rewrites`` started in a forked child, which first lets go of what
        only planning reads (:meth:`_release_in_child`). With ``check`` the child then checks the
        graph each schedule writes (:class:`~onnx_remat.ortsim.check_process.CheckProcess`, a fresh
        process: the child's own would add the check's 0.5 GiB at 10^5 nodes to its pages) and
        hands the verdict over with it (``ScheduleResult.checking``); the file the model goes over
        in is this process's, removed when the child is gone, so a child stopped while its check
        starts leaves nothing behind (the check process dies with the child)."""
        parent = os.getpid()
        files: list[str] = []
        if check:
            for _ in rewrites:
                fd, path = tempfile.mkstemp(prefix=CHECK_FILE_PREFIX, suffix=".onnx")
                os.close(fd)
                files.append(path)

        def schedules() -> list[Scheduled]:
            if os.getpid() != parent:  # (computed here where the child failed: nothing let go)
                self._release_in_child(rewrites)
            made = [self._schedule(r) for r in rewrites]
            for (sched, _), path in zip(made, files):
                checking = CheckProcess.start(sched.model, path)
                if checking is not None:
                    sched.checking = CheckVerdict(checking.result())
            return made

        def remove_files() -> None:
            for path in files:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)

        try:
            return rewrites, Forked.start(schedules, cleanup=remove_files)
        except BaseException:
            remove_files()
            raise

    def _schedule_chosen_ahead(self, bp: BudgetPlan | None) -> None:
        """Start the schedule of ``bp``, the plan the rounds would choose now, in a forked child (on a
        large graph, where the caller schedules the chosen plan: ``plan(schedule_chosen=True)``),
        and stop the one started for another plan. The child then checks the graph the schedule
        writes (:meth:`_start_schedules`), so :meth:`scheduled` takes the schedule with its
        verdict; a plan the rounds then beat costs only the second core's time. At 10^5 nodes the
        schedule is 12-16 s and its check 3 s, and the rounds after the plan is found (a solve at
        least) often as long: the check started when the schedule was taken kept ``apply`` waiting
        about 3 s at the end."""
        rewrite = bp._rewrite if bp is not None and self._speculate else None
        if self._stop_chosen_ahead(unless=rewrite):
            return
        if (
            rewrite is None
            or id(rewrite) in self._schedules
            or not worth_running_beside(len(self.analysis.model.graph.node))
        ):
            return
        self._chosen_ahead = self._start_schedules([rewrite], check=True)

    def _stop_chosen_ahead(self, *, unless: RewriteResult | ParkedRewrite | None) -> bool:
        """Stop the schedule made ahead for the chosen plan unless it is ``unless``'s; returns
        whether one is left running (``unless``'s)."""
        ahead = self._chosen_ahead
        if ahead is None:
            return False
        if unless is not None and _holds(ahead, unless):
            return True
        ahead[1].cancel()
        self._chosen_ahead = None
        return False

    def _release_in_child(self, rewrites: list[RewriteResult | ParkedRewrite]) -> None:
        """In the child scheduling ``rewrites`` ahead: let go of what only planning reads (the
        child starts with the command's pages, and the schedules' objects then reuse that memory
        rather than add to it), but the emulation kept of one of them."""
        kept = self._kept
        self.release_planning()
        self._ahead = self._chosen_ahead = None  # (the parent's; the child never takes them)
        if kept is not None and any(kept[0]._rewrite is r for r in rewrites):
            self._kept = kept

    def _drop_ahead(self) -> None:
        """Stop the schedules started ahead that were not asked for."""
        if self._ahead is not None:
            self._ahead[1].cancel()
            self._ahead = None

    def _solve(self, model_budget: int) -> Solution | None:
        return solve(self.problem, model_budget, store=self._rotors)

    def plan(
        self, budget: int, *, progress: Callable[[str], None] | None = None, schedule_chosen: bool = False
    ) -> BudgetResult:
        """The cheapest plan found whose exact planned peak is at most ``budget`` bytes.

        Raises a one-line :class:`RematError` naming the lowest reachable peak when none fits.
        ``schedule_chosen``: the caller will schedule the chosen plan (:meth:`scheduled`, as
        ``apply`` does); on a large graph the plan the rounds would choose (the cheapest reference
        that fits, then each cheaper plan they find) is then scheduled beside them, in a forked
        child (:meth:`_schedule_chosen_ahead`).
        """
        if budget <= 0:
            raise RematError(f"the budget must be positive, got {budget} bytes")
        self._budget = budget  # (which evaluated plan's emulation is kept: _keeps_kept)
        base = self.baseline_peak
        attempts: list[Attempt] = []
        if budget >= base:
            self._cancel_early()  # (no reference is evaluated for this budget; another may)
            none = BudgetPlan(NONE, None, None, self.baseline, 0.0, self.costs.total, [])
            return BudgetResult(
                budget,
                none,
                base,
                attempts,
                [],
                [f"the unrewritten graph fits: planned peak {format_bytes(base)} <= {format_bytes(budget)}"],
            )
        refs = self.references()  # also teaches the model where it is off for whole-layer recompute
        # every budget starts from what the reference plans taught (so a plan does not depend on
        # the budgets planned before it), then learns from its own rounds
        self.fix = dict(self._reference_fix)
        # The references above the budget are scheduled after the rounds (_fits): from here on.
        if self.schedule:
            self._schedule_ahead(
                [r._rewrite for r in refs if r._rewrite is not None and r.scheduled is None and r.peak > budget]
            )
        self._speculate = self.schedule and schedule_chosen
        try:
            result = self._plan_within(budget, base, refs, attempts, progress)
        except BaseException:
            self._stop_chosen_ahead(unless=None)
            raise
        finally:
            self._drop_ahead()
            self._speculate = False
        self._stop_chosen_ahead(unless=result.chosen._rewrite)  # (beaten: the caller schedules another plan)
        return result

    def _plan_within(
        self,
        budget: int,
        base: int,
        refs: list[BudgetPlan],
        attempts: list[Attempt],
        progress: Callable[[str], None] | None,
    ) -> BudgetResult:
        """:meth:`plan`'s rounds, references and floor for a budget below the baseline."""
        best: BudgetPlan | None = None
        seen: dict[str, int] = {}  # the solutions checked: key -> exact planned peak
        # the cheapest reference that fits unscheduled is chosen unless the rounds find a cheaper plan
        fitting = [r for r in refs if r.peak <= budget]
        self._schedule_chosen_ahead(min(fitting, key=lambda r: r.cost) if fitting else None)
        model_budget = budget
        # MAX_ROUNDS plans checked at most; the solves in between that only lower the aim count
        # towards twice that
        for _ in range(2 * MAX_ROUNDS):
            if len(seen) >= MAX_ROUNDS:
                break
            sol = self._solve(model_budget)
            if sol is None:
                attempts.append(Attempt(model_budget, None, None, False))
                break
            key = _solution_key(sol)
            if key in seen:
                # The corrected model picks a plan it has already checked. Where that plan missed
                # the budget narrowly, the model is off by about that much wherever it plans near
                # the budget: aim that much lower and solve again (seen on chains of hundreds of
                # layers: the corrections leave every plan 1-2% over, and the rounds ended at the
                # per-layer reference, at 1.6 times the compute of the plan found one aim lower;
                # swin_ts at 7.35 MiB: per-layer's 29.2% where a plan of 8.6% fits).
                # A plan that missed by more says the model is too far off to steer by its aim.
                miss = seen[key] - budget
                if 0 < miss <= NEAR_MISS * budget:
                    model_budget -= miss
                    continue
                break
            bp = self.realize(sol)
            seen[key] = bp.peak
            bp.model_budget = model_budget
            # what plans teach only makes the model more careful: corrections learnt in one context
            # (a unit on its own) would otherwise be undone in another (the same unit in a group)
            self.learn(bp, raise_only=True)
            fits = bp.peak <= budget
            attempts.append(Attempt(model_budget, bp.peak, bp.cost, fits))
            if progress:
                progress(f"model budget {format_bytes(model_budget)}: planned peak {format_bytes(bp.peak)}")
            if fits and (best is None or bp.cost < best.cost):
                best = bp
                if not any(r.peak <= budget and r.cost < bp.cost for r in refs):
                    self._schedule_chosen_ahead(bp)
        # The rounds are done: their rotor tables go before the schedules below (0.4 GiB at 3,850
        # layers). A store serves only one budget (its tables' shape is the budget's).
        self._rotors = RotorStore()
        for ref in refs:
            if self._fits(ref, budget) and (best is None or ref.cost < best.cost):
                best = ref
        if best is None:
            floor = self.floor()
            if self._fits(floor, budget):
                # the floor search found a plan the rounds for this budget did not: take it
                # (a budget at the floor it names is never refused)
                best = floor
        if best is None:
            wanted, lowest = format_bytes_apart(budget, floor.written_peak)
            raise RematError(
                f"budget {wanted} is below the lowest planned peak onnx-remat reaches for this "
                f"graph, {lowest} ({floor.written_peak / base:.0%} of the unrewritten "
                f"{format_bytes(base)}); nothing written"
            )
        notes = list(self.reference_notes)
        if best.source != PLANNER:
            notes.append(f"{best.source} recompute fits the budget for the least compute found")
        return BudgetResult(budget, best, base, attempts, refs, notes)

    def floor(self) -> BudgetPlan:
        """The plan with the lowest exact planned peak found: the model's least feasible budget,
        calibrated, and the reference plans."""
        if self._floor is not None:
            return self._floor
        base = self.baseline_peak
        refs = self.references()
        self.fix = dict(self._reference_fix)  # as plan() starts: the floor does not depend on what ran before
        lo = max(self.problem.outside_need, 1)
        searched = least_budget(self.problem, lo, base)
        found: list[BudgetPlan] = []
        if searched is not None:
            least, sol = searched
            found.append(self.realize(sol))
            # the least feasible model budget is not always the least exact peak: try a little above
            for factor in (1.02, 1.05, 1.1):
                s2 = solve(self.problem, int(least * factor))
                if s2 is not None:
                    found.append(self.realize(s2))
        found += refs
        found.append(BudgetPlan(NONE, None, None, self.baseline, 0.0, self.costs.total, []))
        if self.schedule:
            # each candidate is scheduled below (14 s at 10^5 nodes): on a large graph, the later
            # half in a forked child while this process schedules the first
            needing = list(
                {id(c._rewrite): c._rewrite for c in found if c._rewrite is not None and c.scheduled is None}.values()
            )
            self._schedule_ahead(needing[(len(needing) + 1) // 2 :])
        try:
            for candidate in found:
                self._fits(candidate, 0)  # schedules it (where the planner schedules), for its written peak
        finally:
            self._drop_ahead()
        self._floor = min(found, key=lambda p: (p.written_peak, p.cost))
        return self._floor

    def sweep(self, budgets: list[int] | None = None, points: int = 8) -> Sweep:
        """The trade-off curve: plans for ``budgets`` (default: ``points`` budgets from the
        unrewritten peak down to the floor, closer together towards the floor, and the reference
        plans' peaks), the reference plans and the floor."""
        floor = self.floor()
        base = self.baseline_peak
        if budgets is None:
            # denser towards the floor, where the trade-offs are; plus the references' peaks
            hi, lo = base, floor.peak
            grid = {int(lo + (hi - lo) * (i / (points - 1)) ** 2) for i in range(points)}
            grid |= {r.written_peak for r in self.references() if lo <= r.written_peak <= hi}
            budgets = sorted(grid, reverse=True)
        out = []
        for b in budgets:
            try:
                out.append(SweepPoint(b, self.plan(b).chosen))
            except RematError:
                out.append(SweepPoint(b, None))
        return Sweep(base, self.costs.total, out, self.references(), floor, self.costs.source)


MIN_BUDGET = "min"  # apply(budget="min"): the lowest exact planned peak the planner finds


def parse_budget(budget: int | float | str, baseline_peak: int) -> int:
    """Bytes of a budget given as bytes (int), a size (``"60MiB"``, ``"1.5GiB"``) or a share of the
    unrewritten graph's planned peak (``"40%"``). Raises a one-line RematError otherwise."""
    from onnx_remat.units import parse_size

    if isinstance(budget, bool):
        raise RematError(f"not a budget: {budget!r}")
    if isinstance(budget, (int, float)):
        value = int(budget)
    else:
        text = str(budget).strip()
        if text.endswith("%"):
            try:
                share = float(text[:-1])
            except ValueError:
                raise RematError(f"not a budget: {budget!r} (examples: 60MiB, 40%)") from None
            if not 0 < share <= 1000:
                raise RematError(f"a budget share must be above 0%, got {budget!r}")
            value = int(baseline_peak * share / 100)
        else:
            try:
                value = parse_size(text)
            except RematError:
                raise RematError(f"not a budget: {budget!r} (examples: 60MiB, 40%)") from None
    if value <= 0:
        raise RematError(f"the budget must be positive, got {budget!r}")
    return value


def apply_budget(
    analysis: ModelAnalysis,
    budget: int | float | str,
    *,
    profile=None,
    dropout: str | None = None,
    schedule: bool = True,
    grad_accumulation: str = "inplace",
):
    """:func:`onnx_remat.apply` with a budget: an :class:`~onnx_remat.ApplyResult` whose rewrite is
    the chosen plan (the unrewritten graph when it fits already) and whose ``budget`` is the
    :class:`BudgetResult`.

    With ``schedule`` the chosen rewrite then goes through the memory schedule, as ``apply`` does
    for a selection (:func:`onnx_remat.scheduling.schedule.order_rewrite`), and the scheduled graph is taken
    when its estimated planned peak is no higher. The plan itself is chosen, and an unreachable
    budget refused, on the planner's figures for the unscheduled rewrite: scheduling only lowers
    the peak of a plan that already fits (``ApplyResult.estimate_after`` is the graph written).
    """

    planner = BudgetPlanner(
        analysis, profile=profile, dropout=dropout, schedule=schedule, grad_accumulation=grad_accumulation
    )
    if isinstance(budget, str) and budget.strip().lower() == MIN_BUDGET:
        # the floor's own written peak: plan() then takes the floor (or a cheaper plan as low)
        limit = int(planner.floor().written_peak)
    else:
        limit = parse_budget(budget, planner.baseline_peak)
    result = planner.plan(limit, schedule_chosen=schedule)
    chosen = result.chosen
    scheduled = None
    after = chosen.estimate
    rewritten = chosen._rewrite is not None and chosen.plan is not None
    costs_source, baseline = planner.costs.source, planner.baseline
    planner.release_planning(keep=chosen._rewrite)
    if not rewritten:
        plan = RecomputePlan(segments=[], notes=list(result.notes))
        rewrite = RewriteResult(model=analysis.model, segments=[])
        model = rewrite.model
    else:
        assert chosen.plan is not None and chosen._rewrite is not None
        plan = chosen.plan
        if schedule:
            if chosen.scheduled is not None:  # a reference plan the planner scheduled already
                candidate, est = chosen.scheduled, chosen.scheduled_estimate
            else:
                # (parked or not: as the planner keeps it)
                candidate, est = planner.scheduled(chosen._rewrite, check_ahead=True)
            if est.planned_peak_bytes <= chosen.peak:
                scheduled, after = candidate, est
            elif candidate.checking is not None:  # (not written: its check is not wanted)
                candidate.checking.cancel()
                candidate.checking = None
            del candidate
        # read after the schedule, which reads a parked model itself: one copy of it at a time
        read = chosen.rewrite
        assert read is not None
        rewrite = read
        model = scheduled.model if scheduled is not None else rewrite.model
    # The planner is done with (its figures are taken): at 10^5 nodes its caches (the original's
    # emulation, the solver's tables) held a GiB under the output's validity check below (the
    # schedules it made are kept without their emulations: BudgetPlanner._schedule). The plans'
    # figures and models stay in the result.
    del planner
    if rewritten:
        # the check the schedule started beside its emulation, where it made the graph written
        check_scheduled(scheduled, model, "rewritten model")
    peak = int(after.planned_peak_bytes)  # type: ignore[attr-defined]
    result.written_peak = peak
    sched_note = (
        f", {format_bytes(chosen.peak)} before the schedule" if scheduled is not None and peak != chosen.peak else ""
    )
    notes = [
        f"budget {format_bytes(limit)}: estimated planned peak {format_bytes(peak)}{sched_note} "
        f"(unrewritten {format_bytes(result.baseline_peak)}), added compute {chosen.added:.1%} of a step "
        f"({costs_source} costs)",
        *result.notes,
    ]
    return ApplyResult(
        model=model,
        plan=plan,
        rewrite=rewrite,
        analysis=analysis,
        notes=notes,
        estimate_before=baseline,
        estimate_after=after,  # type: ignore[arg-type]
        schedule=scheduled,
        budget=result,
    )
