"""``onnx_remat.apply``: select, plan and rewrite in one call, then save the result safely.

>>> import onnx_remat
>>> result = onnx_remat.apply("models/artifacts/blocks10", scopes=["Block"])
>>> result.save("blocks10_remat")          # a complete artifacts directory
>>> result.released_bytes                  # stored activation bytes released, per the plan

``onnx-remat apply MODEL --scope PATTERN [-o OUT]`` is this function plus printing.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

import onnx

from onnx_remat import collector
from onnx_remat.analysis.model import ModelAnalysis, ModelLike, analyze_model, runtime_judged
from onnx_remat.errors import RematError, UsageError
from onnx_remat.forked import beside
from onnx_remat.graph.kernel_workarounds import WORKAROUND_NOTE
from onnx_remat.graph.random_order import random_ops
from onnx_remat.remat.budget import apply_budget
from onnx_remat.remat.pipeline import RewritePipeline, emulate_original, unpacking_at_peak
from onnx_remat.remat.plan import RecomputePlan, Selection, planner_of
from onnx_remat.remat.random_ops import DEFAULT_DROPOUT, check_dropout_mode
from onnx_remat.remat.result import ApplyResult
from onnx_remat.remat.rewrite import check_not_rewritten
from onnx_remat.scheduling.schedule import check_scheduled
from onnx_remat.units import format_bytes, plural

if TYPE_CHECKING:
    pass


SEED_NOTE = (
    "dropout=seed: {n} Dropouts now draw from seeds of their own (their recompute draws the same masks), "
    "not from onnxruntime's global generator: the random stream differs from the original graph's, so loss "
    "and gradients are not bit-identical to it by design (onnx-remat compare checks them against the "
    "original with the same seeds)"
)


def as_list(value: str | Iterable[str] | None) -> list[str]:
    """A selection argument as a list: comma-separated strings split, blanks dropped."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    out: list[str] = []
    for item in value:
        out.extend(p.strip() for p in item.split(",") if p.strip())
    return out


@collector.pauses
def plan(
    analysis: ModelAnalysis,
    *,
    scopes: str | Iterable[str] | None = None,
    op_types: str | Iterable[str] | None = None,
    nodes: str | Iterable[str] | None = None,
    recompute_outputs: bool = False,
    dropout: str = DEFAULT_DROPOUT,
) -> RecomputePlan:
    """The recompute plan for a selection, without rewriting (used by ``apply`` and ``estimate``)."""
    selection = Selection(
        scopes=as_list(scopes),
        op_types=as_list(op_types),
        nodes=list(nodes) if isinstance(nodes, (list, tuple)) else as_list(nodes),
        recompute_outputs=recompute_outputs,
    )
    return planner_of(analysis, dropout).plan(selection)


@collector.pauses
def apply(
    model: ModelLike | ModelAnalysis,
    *,
    scopes: str | Iterable[str] | None = None,
    op_types: str | Iterable[str] | None = None,
    nodes: str | Iterable[str] | None = None,
    recompute_outputs: bool = False,
    dims: dict[str, int] | None = None,
    eval_model: str | os.PathLike | onnx.ModelProto | None = None,
    check_peak: bool = True,
    dropout: str = DEFAULT_DROPOUT,
    dropout_seed: int = 0,
    schedule: bool = True,
    grad_accumulation: str = "inplace",
    budget: int | str | None = None,
    profile: str | os.PathLike | dict | None = None,
) -> ApplyResult:
    """Recompute the selected activations of a training graph; returns an :class:`ApplyResult`.

    ``model``: a training graph file, an artifacts directory, an ``onnx.ModelProto``, or the
    :class:`~onnx_remat.analysis.ModelAnalysis` of one (which is used, not redone; ``dims`` and
    ``eval_model`` are then ignored).
    Select with ``scopes`` (module paths, globs or class names, e.g. ``"Block"`` or
    ``"blocks.*"``), ``op_types`` (``"Softmax,Gelu"``) and/or ``nodes`` (node names);
    ``recompute_outputs`` merges adjacent recomputed scopes (MindSpore's ``output_recompute``).
    ``dims`` binds symbolic dimensions for the memory figures.

    ``dropout`` says how a recomputed ``Dropout`` gets its mask back
    (:mod:`onnx_remat.remat.random_ops`): ``"packed"`` (default) stores it at one bit per element
    and replays it bit-identically (with ``check_peak``, unless the estimate is lower with the
    masks as bytes: then they stay bytes, and a note says so); ``"byte"`` stores it as it is (one byte per element);
    ``"seed"`` stores none and draws again from a seed given to the forward Dropout as well
    (``dropout_seed`` shifts the seeds): the recomputed mask equals the forward one, but the
    random stream differs from the original graph's, so loss and gradients are not
    bit-identical to it by design.

    With ``schedule`` (the default) the rewrite then goes through the memory schedule
    (:class:`~onnx_remat.scheduling.schedule.MemorySchedule`: an execution order with a lower
    planned peak, written into the node list, and ``grad_accumulation`` for the partial gradients
    of shared parameters: ``"inplace"`` (exact), ``"early"`` (bit-identical with gradients reset
    every step, rounds differently across accumulation steps) or ``"sum"``); ``ApplyResult.model``
    is the scheduled graph. It needs every dimension bound, as the estimate does.

    With ``check_peak`` (the default) the planned peak of the original and of the (scheduled)
    rewrite are estimated (:mod:`onnx_remat.estimate`, nothing runs; ``ApplyResult.estimate_before``
    / ``estimate_after``), and segments whose recompute would raise it are skipped and reported,
    until the rewrite's estimated peak is no higher than the original's. Nothing is written:
    call :meth:`ApplyResult.save`. Raises :class:`~onnx_remat.errors.RematError` on bad input,
    a selection that matches nothing, or one of which nothing can be recomputed.

    ``budget`` (bytes, ``"60MiB"``, ``"40%"`` of the unrewritten planned peak, or ``"min"``: the
    lowest exact planned peak the planner finds) replaces the
    selection: onnx-remat chooses what to recompute so that the estimated planned peak fits, at the
    least added compute (:mod:`onnx_remat.remat.budget`; ``profile``: per-node costs, see
    :func:`onnx_remat.remat.cost.node_costs`). ``ApplyResult.budget`` says how; a budget below the
    lowest reachable peak raises a RematError naming that peak.
    """
    from onnx_remat.scheduling.accumulate import MODES

    if grad_accumulation not in MODES:
        raise RematError(f"gradient accumulation must be one of {', '.join(MODES)}, not {grad_accumulation!r}")
    check_dropout_mode(dropout)
    if not isinstance(model, ModelAnalysis):
        # onnxruntime's load check of the file runs beside the whole command (runtime_judged).
        model = analyze_model(model, eval_model=eval_model, dims=dims, defer_load_check=True)
    with runtime_judged(model):
        return _apply_analysed(
            model,
            scopes=scopes,
            op_types=op_types,
            nodes=nodes,
            recompute_outputs=recompute_outputs,
            check_peak=check_peak,
            dropout=dropout,
            dropout_seed=dropout_seed,
            schedule=schedule,
            grad_accumulation=grad_accumulation,
            budget=budget,
            profile=profile,
        )


def _apply_analysed(
    analysis: ModelAnalysis,
    *,
    scopes: str | Iterable[str] | None,
    op_types: str | Iterable[str] | None,
    nodes: str | Iterable[str] | None,
    recompute_outputs: bool,
    check_peak: bool,
    dropout: str,
    dropout_seed: int,
    schedule: bool,
    grad_accumulation: str,
    budget: int | str | None,
    profile: str | os.PathLike | dict | None,
) -> ApplyResult:
    """:func:`apply` on an analysed graph."""
    from onnx_remat.memory import check_dims

    check_not_rewritten(analysis.graph)
    if budget is not None:
        if any(as_list(x) for x in (scopes, op_types)) or nodes or recompute_outputs:
            raise UsageError("give a budget or a selection (scopes, op types, nodes), not both")
        return apply_budget(
            analysis,
            budget,
            profile=profile,
            dropout=dropout,
            schedule=schedule,
            grad_accumulation=grad_accumulation,
        )
    notes: list[str] = []
    try:
        check_dims(analysis)
        unbound = None
    except RematError as exc:
        unbound = str(exc)
    if check_peak and unbound:
        notes.append(f"the planned peak was not checked: {unbound}")
    if schedule and unbound:
        schedule = False
        notes.append(f"the rewrite was not scheduled: {unbound}")

    def planned(mode: str) -> RecomputePlan:
        return plan(
            analysis, scopes=scopes, op_types=op_types, nodes=nodes, recompute_outputs=recompute_outputs, dropout=mode
        )

    # The input graph is emulated once, where needed: for its planned peak, and for the order its
    # random ops draw in, which every rewrite keeps (the order needs no sizes). On a large graph it
    # runs in a forked child beside the rewrite (the second core is otherwise idle there:
    # onnx_remat.forked); the rewrite's order stage takes it. It is started after the plan: a plan
    # that asks which Transposes onnxruntime moves has the emulation made for that
    # (ModelAnalysis.moved_transposes), and the child then takes it, not made again, and estimates it.
    check_peak = check_peak and not unbound
    first = planned(dropout)
    original = None
    if check_peak or len(random_ops(analysis.model)) > 1:
        original = beside(lambda: emulate_original(analysis, estimate=check_peak), len(analysis.model.graph.node))
        analysis.release_emulation()  # (where the child took it: not held here too)

    pipeline = RewritePipeline(
        analysis,
        original,
        schedule=schedule,
        grad_accumulation=grad_accumulation,
        dropout_seed=dropout_seed,
        estimate=check_peak,
        check_ahead=True,
    )
    del original
    try:
        checked = pipeline.checked(first)
    finally:
        pipeline.cancel()  # (a plan refused before any rewrite was ordered: the child's work is moot)
    before = pipeline.original.estimate if pipeline.original is not None else None
    if checked.rewrite.packed_masks and checked.estimate is not None and unpacking_at_peak(checked.estimate):
        # Packing trades the masks' bytes for unpacking scratch in the backward pass. Where the
        # estimate says the trade loses (seen: --recompute-outputs, whose stages unpack every
        # earlier block's masks again), the masks stay bytes. Byte masks are 8 times the packed
        # bytes at every other point, so the byte variant can only win where unpacking scratch
        # is live at the packed rewrite's peak: only then is it made (it costs a whole pipeline run).
        byte = pipeline.checked(planned("byte"))
        assert byte.estimate is not None
        if byte.estimate.planned_peak_bytes < checked.estimate.planned_peak_bytes:
            notes.append(
                "dropout masks kept at one byte per element: packing them raises the estimated planned peak "
                f"({format_bytes(checked.estimate.planned_peak_bytes)} against "
                f"{format_bytes(byte.estimate.planned_peak_bytes)})"
            )
            checked = byte
        del byte  # (the variant not taken)
    result_model = checked.ordered.model
    # The rewrite's emulation is done with (its estimate is taken): at 10^5 nodes it holds a quarter
    # of a GiB, and the output's validity check below, whose C++ parse of the graph is the command's
    # peak, would otherwise sit on top of it. onnx_remat.schedule's result keeps its emulation.
    checked.ordered.emulation = None
    if checked.ordered.schedule is not None:
        checked.ordered.schedule.emulation = None
    if checked.ordered.workarounds:
        notes.append(WORKAROUND_NOTE.format(n=len(checked.ordered.workarounds)))
    # So is the rewrite as it was before the order stage (0.2 GiB at 10^5 nodes, under the same
    # check): the result's rewrite names the model written.
    rewrite = dataclasses.replace(checked.rewrite, model=result_model)
    final_plan, after, schedule_result = checked.plan, checked.estimate, checked.ordered.schedule
    del checked
    check_scheduled(schedule_result, result_model, "rewritten model")
    if rewrite.dropout_seeds:
        notes.append(SEED_NOTE.format(n=len(rewrite.dropout_seeds)))
    unknown = final_plan.unknown_sizes
    if unknown:
        symbols = analysis.sizes.unbound_symbols(unknown)
        hint = f" (bind {', '.join(sorted(symbols))} with --dim name=value)" if symbols else ""
        verb = "is" if len(unknown) == 1 else "are"
        notes.append(f"{plural(len(unknown), 'tensor')} of unknown size {verb} not counted in the bytes released{hint}")
    return ApplyResult(
        model=result_model,
        plan=final_plan,
        rewrite=rewrite,
        analysis=analysis,
        notes=notes,
        estimate_before=before,
        estimate_after=after,
        schedule=schedule_result,
    )
