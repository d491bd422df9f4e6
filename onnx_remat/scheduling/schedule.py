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
3. for each graph, let each list scheduler of :mod:`~onnx_remat.scheduling.orders` propose an
   order, and predict what onnxruntime runs when the graph's leaves (gradient accumulators, the
   loss) are placed in that order's rank at the end of the node list (all a node list can say
   without adding nodes, :mod:`~onnx_remat.scheduling.realize`); plan its memory;
4. write the best predictions, keep forward random ops in their original order (``PassThrough``
   pins, only where the new order would change it), and emulate each written graph again, from
   scratch: the planned peak reported is the written graph's, never a prediction;
5. keep the lowest; when nothing beats the input, the input comes back unchanged.

Linear or n log n per order tried (a handful): each step walks the graph a constant number of
times with heaps, no recursion.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

import onnx

from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.ortsim.graph import RuntimeGraph, runtime_graph
from onnx_remat.ortsim.optimizer import optimize
from onnx_remat.ortsim.planner import plan_memory
from onnx_remat.ortsim.shapes import infer_runtime_shapes
from onnx_remat.scheduling.accumulate import MODES, AccumulatedGradient, accumulate_gradients
from onnx_remat.scheduling.orders import POLICIES, leaf_ranked_order, leaves, list_schedule
from onnx_remat.scheduling.realize import pin_random_order, place_leaves, random_ops

if TYPE_CHECKING:
    from onnx_remat.analysis.model import ModelAnalysis, ModelLike
    from onnx_remat.estimate import MemoryEstimate

DEFAULT_ACCUMULATION = "inplace"


@dataclass
class Candidate:
    """One order tried: the graph it orders, the policy, and its planned peaks."""

    graph: str  # "as given" or the gradient accumulation mode the graph was rewritten in
    policy: str  # "as written" (the node list unchanged) or a list scheduler policy
    predicted_peak_bytes: int
    planned_peak_bytes: int | None = None  # of the written graph, emulated again (best few only)

    @property
    def label(self) -> str:
        return self.policy if self.graph == "as given" else f"{self.policy}, {self.graph} accumulation"

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
    pins: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

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
            "random_order_pins": self.pins,
            "notes": self.notes,
        }


@dataclass
class _Graph:
    """A model with its emulation: runtime shapes, the graph onnxruntime runs, its order and peak."""

    label: str
    model: onnx.ModelProto
    sizes: TensorSizes
    rg: RuntimeGraph
    first_added: int  # the index onnxruntime gives the first node its optimizer makes
    order: list[int]
    peak: int


def _emulate(label: str, model: onnx.ModelProto, sizes: TensorSizes) -> _Graph:
    rg = runtime_graph(model, sizes)
    first_added = len(rg.nodes)
    optimize(rg)
    order = rg.default_order()
    return _Graph(label, model, sizes, rg, first_added, order, plan_memory(rg, order).planned_peak_bytes)


def _random_names(g: _Graph) -> list[str]:
    wanted = {n.name for n in random_ops(g.model)}
    return [name for i in g.order for name in g.rg.at(i).origin if name in wanted]


class MemorySchedule:
    """The schedule pass: ``MemorySchedule()(model, sizes)`` returns a :class:`ScheduleResult`.

    ``grad_accumulation``: ``"inplace"`` (default: partial gradient sums added in place, exact in
    every case), ``"early"`` (each partial into the gradient buffer as it exists: bit-identical on a
    step with reset gradients, rounds differently across accumulation steps; see
    :mod:`~onnx_remat.scheduling.accumulate`) or ``"sum"`` (sums as written). ``policies``: the
    list schedulers to try; ``verify``: how many of the best predictions are written and
    emulated again.
    """

    def __init__(
        self, *, grad_accumulation: str = DEFAULT_ACCUMULATION, policies: Sequence[str] = POLICIES, verify: int = 3
    ):
        if grad_accumulation not in MODES:
            raise ValueError(f"grad_accumulation must be one of {', '.join(MODES)}, not {grad_accumulation!r}")
        self.grad_accumulation = grad_accumulation
        self.policies = tuple(policies)
        self.verify = verify

    def __call__(
        self, model: onnx.ModelProto, sizes: TensorSizes, *, random_order: Sequence[str] | None = None
    ) -> ScheduleResult:
        """Schedule ``model`` (``sizes``: its tensor sizes, symbolic dimensions bound; not changed).

        ``random_order``: names of the forward random ops in the order their draws must keep
        (default: the order onnxruntime runs ``model`` in, emulated).
        """
        given_sizes = sizes.copy()
        infer_runtime_shapes(model, given_sizes)
        given = _emulate("as given", model, given_sizes)
        wanted_random = list(random_order) if random_order is not None else _random_names(given)
        graphs = [given]
        accumulation = accumulate_gradients(model, given.rg, given.order, self.grad_accumulation)
        if accumulation.gradients:
            acc_sizes = TensorSizes(accumulation.model, sizes.dims)
            infer_runtime_shapes(accumulation.model, acc_sizes)
            graphs.append(_emulate(self.grad_accumulation, accumulation.model, acc_sizes))

        candidates: list[tuple[Candidate, _Graph, dict[str, float] | None]] = []
        for g in graphs:
            if g is not given:
                candidates.append((Candidate(g.label, "as written", g.peak), g, None))
            ends = set(leaves(g.rg))
            for policy in self.policies:
                target = list_schedule(g.rg, g.order, policy)
                rank = {i: k for k, i in enumerate(target) if i in ends}
                predicted = leaf_ranked_order(g.rg, g.first_added, rank)
                peak = plan_memory(g.rg, predicted).planned_peak_bytes
                ranks = {name: float(k) for i, k in rank.items() for name in g.rg.at(i).origin}
                candidates.append((Candidate(g.label, policy, peak), g, ranks))
        candidates.sort(key=lambda c: c[0].predicted_peak_bytes)

        present = {n.name for n in random_ops(model)}
        wanted_random = [n for n in wanted_random if n in present]
        best: tuple[int, Candidate, onnx.ModelProto, list[str]] | None = None
        checked_lists: dict[tuple[str, ...], int] = {}
        # Only predictions below the input's peak are worth writing (a handful at most).
        promising = [c for c in candidates if c[0].predicted_peak_bytes < given.peak][: self.verify]
        for cand, g, names in promising:
            written = place_leaves(g.model, names) if names is not None else g.model
            key = tuple(n.name for n in written.graph.node)
            if key in checked_lists:  # another policy gave the same node list
                cand.planned_peak_bytes = checked_lists[key]
                continue
            checked = _emulate(g.label, written, g.sizes)
            pins: list[str] = []
            if len(wanted_random) > 1 and _random_names(checked) != wanted_random:
                written, pins = pin_random_order(written, wanted_random)
                pinned_sizes = g.sizes.copy()
                infer_runtime_shapes(written, pinned_sizes)
                checked = _emulate(g.label, written, pinned_sizes)
            cand.planned_peak_bytes = checked_lists[key] = checked.peak
            if best is None or checked.peak < best[0]:
                best = (checked.peak, cand, written, pins)

        result = ScheduleResult(
            model=model,
            planned_peak_before=given.peak,
            planned_peak_after=given.peak,
            chosen=None,
            candidates=[c for c, _, _ in candidates],
            accumulated=accumulation.gradients,
            accumulation_skipped=accumulation.skipped,
        )
        if best is None or best[0] >= given.peak:
            result.notes.append("no order tried lowers the planned peak: the graph is left as it was")
            result.accumulated = []
            return result
        result.model, result.chosen, result.pins = best[2], best[1], best[3]
        result.planned_peak_after = best[0]
        if best[1].graph == "as given":
            result.accumulated = []
        return result


# -- onnx_remat.schedule: the command's library function -------------------------------------------


@dataclass
class ScheduledModel:
    """:func:`schedule`'s result: the scheduled training graph, its estimates, and how to save it."""

    model: onnx.ModelProto
    schedule: ScheduleResult
    analysis: ModelAnalysis
    estimate_before: MemoryEstimate
    estimate_after: MemoryEstimate

    def default_output(self) -> Path:
        """Where :meth:`save` writes without a path: ``x.scheduled.onnx`` or ``<artifacts>_scheduled/``
        in the current directory (as :meth:`onnx_remat.ApplyResult.default_output`)."""
        from onnx_remat.errors import RematError
        from onnx_remat.model_io import remat_output

        src = self.analysis.source
        if src is None:
            raise RematError("the model was given in memory: give an output path")
        return remat_output(src.artifacts_dir or src.path, kind="scheduled")[0]

    def save(self, path: str | os.PathLike | None = None, *, force: bool = False) -> Path:
        """Write the result atomically, exactly as :meth:`onnx_remat.ApplyResult.save` writes a
        rewrite (an artifacts directory from one, else a model file; ``force`` to replace);
        returns where."""
        from onnx_remat.remat.apply import ApplyResult

        # One implementation of "save a graph derived from this analysis": ApplyResult's, which
        # reads only .analysis, .model and .default_output().
        return ApplyResult.save(cast("ApplyResult", self), path, force=force)

    def summary(self) -> dict:
        """JSON-ready: the model, the estimates before and after, and the schedule's choices."""
        return {
            "model": self.analysis.name,
            "planned_peak_bytes_before": self.estimate_before.planned_peak_bytes,
            "planned_peak_bytes_after": self.estimate_after.planned_peak_bytes,
            "ratio": (
                self.estimate_after.planned_peak_bytes / self.estimate_before.planned_peak_bytes
                if self.estimate_before.planned_peak_bytes
                else None
            ),
            **{k: v for k, v in self.schedule.summary().items() if not k.startswith("planned_peak")},
        }


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
    from onnx_remat.analysis.model import ModelAnalysis, analyze_model
    from onnx_remat.errors import RematError
    from onnx_remat.estimate import check_dims, estimate_original, estimate_rewritten
    from onnx_remat.ortsim.registry import check_runtime_support

    if grad_accumulation not in MODES:
        raise RematError(f"gradient accumulation must be one of {', '.join(MODES)}, not {grad_accumulation!r}")
    analysis = model if isinstance(model, ModelAnalysis) else analyze_model(model, eval_model=eval_model, dims=dims)
    check_dims(analysis)
    before = estimate_original(analysis)
    result = MemorySchedule(grad_accumulation=grad_accumulation)(
        analysis.model, analysis.sizes, random_order=[n for n in before.order_names]
    )
    after = estimate_rewritten(analysis, result.model) if result.changed else before
    if after.planned_peak_bytes != result.planned_peak_after:
        raise RuntimeError(
            f"schedule: the estimate ({after.planned_peak_bytes}) and the pass ({result.planned_peak_after}) disagree"
        )
    check_runtime_support(result.model, "scheduled model")
    return ScheduledModel(result.model, result, analysis, before, after)
