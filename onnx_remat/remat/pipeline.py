"""The rewrite pipeline: plan -> rewrite -> order -> estimate, one pass per stage.

Every graph onnx-remat writes from a recompute plan goes through the same stages, each a pass
with a declared input and output that leaves its input unchanged:

===========  =======================================================  ===========================
stage        pass                                                     in -> out
===========  =======================================================  ===========================
plan         :class:`~onnx_remat.remat.plan.Planner`                  selection -> RecomputePlan
rewrite      :class:`~onnx_remat.remat.rewrite.RecomputeRewrite`      plan -> RewriteResult
order        :func:`~onnx_remat.scheduling.schedule.order_rewrite`     model -> OrderedGraph: kernel
                                                                      workarounds, random-op
                                                                      pins, the memory schedule,
                                                                      and its Emulation
estimate     :func:`~onnx_remat.memory.estimate_emulated`             Emulation -> MemoryEstimate
===========  =======================================================  ===========================

:class:`RewritePipeline` holds what the stages share for one input graph (its analysis, what
they keep of the original's emulation, made once: :class:`OriginalGraph`, and the options) and
runs them: :meth:`~RewritePipeline.run`
for one plan (the budget planner, for each candidate), :meth:`~RewritePipeline.checked` with the
peak check that drops the segment holding the most at a raised peak (:func:`onnx_remat.apply`).
No stage calls back into ``apply``; the estimate is a query on the order stage's emulation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from onnx_remat.analysis.model import ModelAnalysis
from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.errors import RematError
from onnx_remat.forked import Forked
from onnx_remat.graph import tags
from onnx_remat.memory import MemoryEstimate, estimate_emulated
from onnx_remat.ortsim.emulation import Emulation
from onnx_remat.remat.plan import RecomputePlan, SkippedSegment, nothing_to_recompute
from onnx_remat.remat.rewrite import RecomputeRewrite, RewriteResult, RewriteUnderway
from onnx_remat.scheduling.schedule import OrderedGraph, order_rewrite
from onnx_remat.units import format_bytes


@dataclass
class Rewritten:
    """A plan after the pipeline: the plan (segments dropped by the peak check left out), the
    rewrite (with the random-op pins the order stage added), the ordered graph to write and its
    estimate (None where no estimate was asked for)."""

    plan: RecomputePlan
    rewrite: RewriteResult
    ordered: OrderedGraph
    estimate: MemoryEstimate | None


@dataclass
class OriginalGraph:
    """What the stages keep of the input graph's emulation: the order its random ops draw in (every
    rewrite keeps it), its tensor sizes as emulated (each rewrite's are updated from them:
    :func:`~onnx_remat.ortsim.emulation.emulate_rewrite`) and its estimate (None: not asked for).
    Small beside the emulation, which can go once this is taken."""

    random_order: list[str]
    sizes: TensorSizes
    estimate: MemoryEstimate | None = None

    @classmethod
    def of(cls, emulation: Emulation, analysis: ModelAnalysis | None = None) -> OriginalGraph:
        """From an emulation of ``analysis``'s graph; with ``analysis``, its estimate too."""
        estimate = estimate_emulated(analysis, emulation) if analysis is not None else None
        return cls(emulation.random_order(), emulation.sizes, estimate)


def emulate_original(analysis: ModelAnalysis, *, estimate: bool) -> OriginalGraph:
    """Emulate the analysed input graph once and keep what the stages need of it (with
    ``estimate``, its estimate too). A function of the analysis alone: :func:`onnx_remat.apply`
    runs it in a forked child beside the plan and the rewrite (:func:`onnx_remat.forked.beside`)."""
    return OriginalGraph.of(analysis.take_emulation(), analysis if estimate else None)


class RewritePipeline:
    """The stages after planning, for one analysed training graph.

    ``original``: the emulation of the input graph, or what is kept of it (:class:`OriginalGraph`),
    possibly still being computed (:class:`~onnx_remat.forked.Forked`: taken when the first
    rewrite is ordered); None when the graph has fewer than two random ops and nothing is
    estimated. An emulation itself is not held, so the caller can let it go.
    ``schedule`` / ``grad_accumulation``: the order stage's memory schedule
    (:class:`~onnx_remat.scheduling.schedule.MemorySchedule`); ``dropout_seed``: the rewrite's
    (``dropout="seed"``); ``estimate``: whether each result is estimated; ``check_ahead``: the
    schedule starts the output's validity check of what it writes beside its emulation
    (:func:`~onnx_remat.scheduling.schedule.check_scheduled` takes it).
    """

    def __init__(
        self,
        analysis: ModelAnalysis,
        original: Emulation | OriginalGraph | Forked[OriginalGraph] | None,
        *,
        schedule: bool = True,
        grad_accumulation: str = "inplace",
        dropout_seed: int = 0,
        estimate: bool = True,
        check_ahead: bool = False,
    ):
        self.analysis = analysis
        self.schedule = schedule
        self.grad_accumulation = grad_accumulation
        self.dropout_seed = dropout_seed
        self.estimate = estimate
        self.check_ahead = check_ahead
        if isinstance(original, Emulation):
            original = OriginalGraph.of(original)
        self._original: Forked[OriginalGraph] | OriginalGraph | None = original

    @property
    def original(self) -> OriginalGraph | None:
        """What is kept of the input graph's emulation (waited for, where it is being computed)."""
        if isinstance(self._original, Forked):
            self._original = self._original.result()
        return self._original

    def cancel(self) -> None:
        """Stop the original's emulation where it is still being computed and no longer needed."""
        if isinstance(self._original, Forked):
            self._original.cancel()
            self._original = None

    def order(
        self,
        model,
        *,
        schedule: bool | None = None,
        check_ahead: bool | None = None,
        emulated: Emulation | None = None,
    ) -> OrderedGraph:
        """The order stage on ``model`` (a rewrite of the analysed graph); ``schedule`` and
        ``check_ahead`` override the pipeline's for this call. ``emulated``: the emulation of
        ``model`` an earlier order stage made (``model`` is that stage's output), used rather than
        made again (:func:`~onnx_remat.scheduling.schedule.order_rewrite`)."""
        original = self.original
        return order_rewrite(
            model,
            self.analysis.sizes.dims,
            random_order=original.random_order if original is not None else [],
            schedule=self.schedule if schedule is None else schedule,
            grad_accumulation=self.grad_accumulation,
            emulation=self.estimate,
            original_sizes=original.sizes if original is not None else None,
            check_ahead=self.check_ahead if check_ahead is None else check_ahead,
            emulated=emulated,
        )

    def run(self, plan: RecomputePlan, *, underway: RewriteUnderway | None = None) -> Rewritten:
        """Rewrite ``plan``, order the result and estimate it. ``underway``: the rewrite of ``plan``
        begun already (:func:`begin_rewrite` with this pipeline's ``dropout_seed``), perhaps before
        this pipeline was made."""
        if underway is None:
            underway = begin_rewrite(self.analysis, plan, dropout_seed=self.dropout_seed)
        elif underway.plan is not plan or underway.rewrite.dropout_seed != self.dropout_seed:
            raise ValueError("RewritePipeline.run: the rewrite underway is not this run's")
        # What is kept of the original's emulation is taken (read from its forked child, 0.3 s at
        # 10^5 nodes) while the rewrite is made in its own child, not after it.
        self.original  # noqa: B018
        rewrite = underway.result()
        try:
            ordered = self.order(rewrite.model)  # while the child checks the rewrite's postconditions
        except Exception:
            underway.ensured()  # a rewrite that breaks its postconditions raises that, as it would unforked
            raise
        except BaseException:
            underway.cancel()
            raise
        ensured = underway.ensured()
        if ensured is not rewrite:  # the child's check failed, the rewrite made here passed it
            _drop_check(ordered)
            rewrite, ordered = ensured, self.order(ensured.model)
        rewrite = dataclasses.replace(rewrite, random_order_pins=ordered.pins)
        estimate = estimate_emulated(self.analysis, ordered.emulation) if ordered.emulation and self.estimate else None
        return Rewritten(plan, rewrite, ordered, estimate)

    def checked(self, full_plan: RecomputePlan) -> Rewritten:
        """:meth:`run`, then, while the estimated peak of what would be written is above the original's
        (its :class:`OriginalGraph`'s estimate; None: not checked), drop the segment holding the most
        at the peak and run again. Raises a one-line RematError when no segment is left."""
        dropped: dict[str, str] = {}
        while True:
            plan = dataclasses.replace(
                full_plan,
                segments=[s for s in full_plan.segments if s.label not in dropped],
                skipped=full_plan.skipped + [SkippedSegment(label, why) for label, why in dropped.items()],
            )
            if not plan.segments:
                raise RematError(nothing_to_recompute(plan))
            result = self.run(plan)
            after = result.estimate
            before = self.original.estimate if self.original is not None else None
            if after is None or before is None or after.planned_peak_bytes <= before.planned_peak_bytes:
                return result
            label = culprit(after, result.rewrite)
            rise = after.planned_peak_bytes - before.planned_peak_bytes
            to = format_bytes(after.planned_peak_bytes)
            dropped[label] = f"would raise the estimated planned peak by {format_bytes(rise)} (to {to})"


def begin_rewrite(analysis: ModelAnalysis, plan: RecomputePlan, *, dropout_seed: int = 0) -> RewriteUnderway:
    """The rewrite stage of a pipeline run on ``analysis`` for ``plan``, started
    (:meth:`~onnx_remat.remat.rewrite.RecomputeRewrite.begin`: on a large graph in a forked child),
    for :meth:`RewritePipeline.run` with ``underway=``. It reads the analysis and the plan alone, so
    it may start before the pipeline is made: the budget planner starts its per-layer reference's
    rewrite beside its own set-up, whose input emulation the pipeline holds."""
    return RecomputeRewrite(dropout_seed=dropout_seed).begin(analysis.graph, plan)


def _drop_check(ordered: OrderedGraph) -> None:
    """Stop the output check the order stage started for ``ordered``, no longer written."""
    checking = ordered.schedule.checking if ordered.schedule is not None else None
    if checking is not None:
        checking.cancel()


def unpacking_at_peak(estimate: MemoryEstimate) -> bool:
    """True when the estimated peak is at, or holds a tensor of, the nodes that unpack packed
    dropout masks (:func:`onnx_remat.graph.tags.is_unpack_name`): the only place where keeping
    the masks as bytes could lower the peak."""
    return tags.is_unpack_name(estimate.peak_node or "") or any(
        tags.is_unpack_name(t.producer) for t in estimate.live_at_peak
    )


def culprit(after: MemoryEstimate, rewrite: RewriteResult) -> str:
    """The segment whose recompute holds the most bytes at the rewrite's estimated peak."""
    owner: dict[str, str] = {}
    for seg in rewrite.segments:
        for name in [seg.barrier or "", *seg.clones]:
            owner[name] = seg.label
    boundary: dict[str, list[str]] = {}
    for seg in rewrite.segments:
        for t in seg.segment.boundary:
            boundary.setdefault(t.name, []).append(seg.label)
    held: dict[str, int] = {}
    for t in after.live_at_peak:
        labels = [owner[t.producer]] if t.producer in owner else boundary.get(t.tensor, [])
        for label in labels:
            held[label] = held.get(label, 0) + t.bytes
    if after.peak_node in owner:
        held[owner[after.peak_node]] = held.get(owner[after.peak_node], 0) + 1
    if held:
        return max(held, key=lambda label: (held[label], label))
    return rewrite.segments[-1].label
