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

:class:`RewritePipeline` holds what the stages share for one input graph (its analysis, the
emulation of the original, made once, and the options) and runs them: :meth:`~RewritePipeline.run`
for one plan (the budget planner, for each candidate), :meth:`~RewritePipeline.checked` with the
peak check that drops the segment holding the most at a raised peak (:func:`onnx_remat.apply`).
No stage calls back into ``apply``; the estimate is a query on the order stage's emulation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from onnx_remat.analysis.model import ModelAnalysis
from onnx_remat.errors import RematError
from onnx_remat.graph import tags
from onnx_remat.memory import MemoryEstimate, estimate_emulated
from onnx_remat.ortsim.emulation import Emulation
from onnx_remat.remat.plan import RecomputePlan, SkippedSegment, nothing_to_recompute
from onnx_remat.remat.rewrite import RecomputeRewrite, RewriteResult
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


class RewritePipeline:
    """The stages after planning, for one analysed training graph.

    ``original``: the emulation of the input graph (its random ops' draw order is kept by every
    rewrite; None when the graph has fewer than two random ops and nothing is estimated). Only
    that order and its tensor sizes are kept (each rewrite's sizes are updated from them:
    :func:`~onnx_remat.ortsim.emulation.emulate_rewrite`): the emulation itself is not held, so
    the caller can let it go.
    ``schedule`` / ``grad_accumulation``: the order stage's memory schedule
    (:class:`~onnx_remat.scheduling.schedule.MemorySchedule`); ``dropout_seed``: the rewrite's
    (``dropout="seed"``); ``estimate``: whether each result is estimated.
    """

    def __init__(
        self,
        analysis: ModelAnalysis,
        original: Emulation | None,
        *,
        schedule: bool = True,
        grad_accumulation: str = "inplace",
        dropout_seed: int = 0,
        estimate: bool = True,
    ):
        self.analysis = analysis
        self.schedule = schedule
        self.grad_accumulation = grad_accumulation
        self.dropout_seed = dropout_seed
        self.estimate = estimate
        self.random_order = original.random_order() if original is not None else []
        # What the original's emulation knows of tensor sizes: each rewrite's are updated from it
        # rather than inferred again (a dict of the graph's tensors, small beside the emulation).
        self.original_sizes = original.sizes if original is not None else None

    def order(self, model, *, schedule: bool | None = None) -> OrderedGraph:
        """The order stage on ``model`` (a rewrite of the analysed graph)."""
        return order_rewrite(
            model,
            self.analysis.sizes.dims,
            random_order=self.random_order,
            schedule=self.schedule if schedule is None else schedule,
            grad_accumulation=self.grad_accumulation,
            emulation=self.estimate,
            original_sizes=self.original_sizes,
        )

    def run(self, plan: RecomputePlan) -> Rewritten:
        """Rewrite ``plan``, order the result and estimate it."""
        rewrite = RecomputeRewrite(dropout_seed=self.dropout_seed)(self.analysis.graph, plan)
        ordered = self.order(rewrite.model)
        rewrite = dataclasses.replace(rewrite, random_order_pins=ordered.pins)
        estimate = estimate_emulated(self.analysis, ordered.emulation) if ordered.emulation and self.estimate else None
        return Rewritten(plan, rewrite, ordered, estimate)

    def checked(self, full_plan: RecomputePlan, before: MemoryEstimate | None) -> Rewritten:
        """:meth:`run`, then, while the estimated peak of what would be written is above the original's
        (``before``; None: not checked), drop the segment holding the most at the peak and run again.
        Raises a one-line RematError when no segment is left."""
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
            if after is None or before is None or after.planned_peak_bytes <= before.planned_peak_bytes:
                return result
            label = culprit(after, result.rewrite)
            rise = after.planned_peak_bytes - before.planned_peak_bytes
            to = format_bytes(after.planned_peak_bytes)
            dropped[label] = f"would raise the estimated planned peak by {format_bytes(rise)} (to {to})"


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
