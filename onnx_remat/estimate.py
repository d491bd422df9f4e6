"""``onnx_remat.estimate``: the activation memory of one training step, without running it.

>>> from onnx_remat.estimate import estimate
>>> est = estimate("models/artifacts/blocks10", scopes=["Block"])
>>> est.before.planned_peak_bytes, est.after.planned_peak_bytes      # 215.0 MiB, 71.0 MiB
>>> est.before.live_at_peak[:3]                                       # what fills the peak

How (each step is a pass with its own module, all linear or n log n, no recursion):

1. tensor shapes: onnx's inference, plus onnxruntime's contrib and gradient ops
   (:mod:`onnx_remat.ortsim.shapes`), ``dims`` binding symbolic dimensions;
2. the graph onnxruntime 1.19 actually runs on CPU: its level-1/level-2 rewrites that change
   which tensors exist, emulated (:mod:`onnx_remat.ortsim.optimizer`);
3. its DEFAULT execution order (:mod:`onnx_remat.ortsim.order`), or an order observed at run time
   (``execution_order=``: node names from a profile);
4. its allocation planner and memory pattern, simulated (:mod:`onnx_remat.ortsim.planner`): the
   *planned peak* is the block onnxruntime allocates for a step's activations (what
   ``onnx-remat measure`` reports as planned_peak_bytes), the *timeline* the bytes alive per step.

With a selection (``scopes`` / ``op_types`` / ``nodes``) the recompute rewrite is applied in
memory (nothing is written) and estimated too (``after``).

Accuracy, against onnxruntime-training-cpu 1.19.2 (tests/test_estimate.py, one rule per test in
tests/test_estimate_rules.py): the planned peak is exact to a few KiB (< 0.1%) for the example
models, the 13 corpus architectures and GPT-2 at full width (12 x 768, vocab 50257), each as
exported and after a per-block rewrite, and for the fuzzer's graphs examined (staged recompute
included). What that took beyond the planner itself: outputs no node reads never take a freed
buffer (onnxruntime#21019); the kernels that work in place (Softmax, Cast, Clip, ...); Shape and
Size run right after their input's producer (training builds); ConstantSharing, GemmSumFusion and
the TransposeOptimizer; the shapes onnxruntime infers for its default-domain LayerNormalization
and for LayerNormalizationGrad. Sizes onnxruntime only learns at run time are reported
(``outside_block``), not counted in the planned peak; unknown sizes are listed, never taken as 0.

JSON (:meth:`EstimateResult.to_json`, ``onnx-remat estimate --json``)::

    {"model": "...", "dims": {}, "selection": {"scopes": ["Block"], ...} | null,
     "before": {"planned_peak_bytes": int, "peak_live_bytes": int, "peak_step": int,
                "peak_node": str, "peak_region": "forward" | "backward" | "recompute",
                "executed_nodes": int, "order": "onnxruntime DEFAULT order (emulated)" | "...",
                "runtime_rewrites": {"MatMulScaleFusion": 28, ...},
                "live_at_peak": [{"tensor", "bytes", "producer", "region", "scope"}, ...],
                "outside_block": {"count": int, "bytes": int, "tensors": [...]},
                "unknown": {"count": int, "tensors": [...]},
                "timeline": {"live_bytes": [...], "block_bytes": [...], "region": [...],
                             "nodes": [...]}},
     "after": {... same ...} | null,
     "ratio": float | null,                       # after / before planned peak
     "segments": [...] | null, "skipped": [...],  # as apply's JSON
     "scopes": [{"path", "class", "depth", "stored_bytes", "stored_unknown",
                 "releasable_bytes", "live_at_peak_bytes"}, ...],
     "notes": [...]}
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from onnx_remat import collector
from onnx_remat.analysis.model import ModelAnalysis, ModelLike, analyze_model, runtime_judged
from onnx_remat.memory import (
    BACKWARD,
    FORWARD,
    RECOMPUTE,
    LiveTensor,
    MemoryEstimate,
    Step,
    check_dims,
    estimate_emulated,
    estimate_graph,
    estimate_original,
    estimate_rewritten,
    memory_estimate,
)

if TYPE_CHECKING:
    from onnx_remat.remat.result import ApplyResult


@dataclass
class ScopeMemory:
    """Per scope: stored activations, what recomputing it would release, what is live at the peak."""

    path: str
    class_name: str | None
    depth: int
    stored_bytes: int
    stored_unknown: int
    releasable_bytes: int
    live_at_peak_bytes: int

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "class": self.class_name,
            "depth": self.depth,
            "stored_bytes": self.stored_bytes,
            "stored_unknown": self.stored_unknown,
            "releasable_bytes": self.releasable_bytes,
            "live_at_peak_bytes": self.live_at_peak_bytes,
        }


@dataclass
class EstimateResult:
    """``before`` (and, with a selection, ``after``) estimates of one model."""

    model: str
    before: MemoryEstimate
    after: MemoryEstimate | None = None
    selection: dict | None = None
    segments: list[dict] | None = None
    skipped: list[dict] = field(default_factory=list)
    scopes: list[ScopeMemory] = field(default_factory=list)
    dims: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        if self.after is None or not self.before.planned_peak_bytes:
            return None
        return self.after.planned_peak_bytes / self.before.planned_peak_bytes

    def to_json(self, *, timeline: bool = True) -> dict:
        return {
            "model": self.model,
            "dims": self.dims,
            "selection": self.selection,
            "before": self.before.to_json(timeline=timeline),
            "after": self.after.to_json(timeline=timeline) if self.after else None,
            "ratio": self.ratio,
            "segments": self.segments,
            "skipped": self.skipped,
            "scopes": [s.to_json() for s in self.scopes],
            "notes": self.notes,
        }


def scope_rows(analysis: ModelAnalysis, before: MemoryEstimate, dropout: str) -> list[ScopeMemory]:
    from onnx_remat.analysis.scope_table import scope_report

    report = scope_report(analysis, dropout=dropout)
    live_by_scope: dict[str, int] = {}
    for t in before.live_at_peak:
        path = t.scope
        scope = analysis.scopes.by_path.get(path) if path else None
        while scope is not None and scope.path:
            live_by_scope[scope.path] = live_by_scope.get(scope.path, 0) + t.bytes
            scope = scope.parent
    return [
        ScopeMemory(
            path=r.path,
            class_name=r.class_name,
            depth=r.depth,
            stored_bytes=r.stashed_bytes,
            stored_unknown=r.stashed_unknown,
            releasable_bytes=r.releasable_bytes,
            live_at_peak_bytes=live_by_scope.get(r.path, 0),
        )
        for r in report.rows
    ]


@collector.pauses
def estimate(
    model: ModelLike | ModelAnalysis | ApplyResult,
    *,
    scopes: str | Iterable[str] | None = None,
    op_types: str | Iterable[str] | None = None,
    nodes: str | Iterable[str] | None = None,
    recompute_outputs: bool = False,
    dims: dict[str, int] | None = None,
    execution_order: Sequence[str] | None = None,
    after_execution_order: Sequence[str] | None = None,
    runtime_optimizations: bool = True,
    scope_table: bool = True,
    dropout: str = "packed",
) -> EstimateResult:
    """Estimate the activation memory of a training step, and after a recompute rewrite.

    ``model``: a training graph file, an artifacts directory, an ``onnx.ModelProto``, a
    :class:`ModelAnalysis` (then ``dims`` must already be in it), or an
    :class:`~onnx_remat.ApplyResult` (its input graph and its rewrite are estimated; the
    estimates ``apply`` made are reused where the order and optimizations are the defaults).
    ``scopes`` / ``op_types`` / ``nodes`` / ``recompute_outputs`` / ``dropout`` select what to
    recompute and how dropout masks are kept, as :func:`onnx_remat.apply` takes them; without a
    selection (and without an ApplyResult) only ``before`` is estimated. ``dims`` binds symbolic
    dimensions (``{"batch": 8}``).
    ``execution_order`` / ``after_execution_order``: node names in the order onnxruntime ran them
    (e.g. from a profile) instead of the emulated DEFAULT order. ``runtime_optimizations=False``
    estimates the graph as written, without onnxruntime's rewrites. Whatever it is given, the
    model is analysed at most once.

    Raises :class:`RematError` for symbolic dimensions without a value and selections that
    match nothing. Nothing is written.
    """
    from onnx_remat.remat.apply import apply
    from onnx_remat.remat.result import ApplyResult

    applied: ApplyResult | None = None
    if isinstance(model, ApplyResult):
        applied = model
        analysis = applied.analysis
    else:
        analysis = model if isinstance(model, ModelAnalysis) else analyze_model(model, dims=dims, defer_load_check=True)
        if any(_present(x) for x in (scopes, op_types, nodes)):
            applied = apply(
                analysis,
                scopes=scopes,
                op_types=op_types,
                nodes=nodes,
                recompute_outputs=recompute_outputs,
                dropout=dropout,
            )
    with runtime_judged(analysis):
        defaults = runtime_optimizations
        before = applied.estimate_before if applied is not None and defaults and execution_order is None else None
        if before is None:
            before = estimate_original(
                analysis, execution_order=execution_order, runtime_optimizations=runtime_optimizations
            )
        result = EstimateResult(model=analysis.name, before=before, dims=dict(analysis.sizes.dims))
        if scope_table:
            result.scopes = scope_rows(analysis, before, applied.dropout if applied is not None else dropout)
        if applied is not None:
            after = applied.estimate_after if defaults and after_execution_order is None else None
            if after is None:
                after = estimate_rewritten(
                    analysis,
                    applied.model,
                    execution_order=after_execution_order,
                    runtime_optimizations=runtime_optimizations,
                )
            _attach(result, applied, after)
        _add_notes(result)
        return result


def _present(value) -> bool:
    if value is None:
        return False
    if isinstance(value, str):
        return bool(value.strip())
    return any(str(v).strip() for v in value)


def _attach(result: EstimateResult, applied: ApplyResult, after: MemoryEstimate) -> None:
    """Put the rewrite's estimate and summary into ``result``."""
    result.after = after
    summary = applied.summary()
    result.segments = summary["segments"]
    result.skipped = summary["skipped"]
    result.selection = {
        "scopes": sorted({p for s in summary["segments"] for p in s.get("scopes", [])}),
        "segments": len(summary["segments"]),
        "cloned_nodes": summary["cloned_nodes"],
        "released_bytes": summary["released_bytes"],
        "dropout": summary["dropout"],
        "mask_bytes": summary["mask_bytes"],  # stored for the replayed dropout masks (per segment: segments)
    }
    result.notes.extend(summary["notes"])


def _add_notes(result: EstimateResult) -> None:
    for label, est in (("before", result.before), ("after", result.after)):
        if est is None:
            continue
        if est.unknown:
            n = len(est.unknown)
            result.notes.append(
                f"{label}: {plural(n, 'activation')} of unknown size {'is' if n == 1 else 'are'} not counted "
                f"({'e.g. ' if n > 3 else ''}{', '.join(est.unknown[:3])})"
            )
        if est.outside_block:
            n = len(est.outside_block)
            have = "has" if n == 1 else "have"
            result.notes.append(
                f"{label}: {plural(n, 'tensor')} ({_mib(est.outside_block_bytes)} in all) {have} shapes "
                "onnxruntime learns only at run time; it allocates them outside the planned block"
            )


def plural(n: int, word: str) -> str:
    from onnx_remat.units import plural as _plural

    return _plural(n, word)


def _mib(n: int) -> str:
    from onnx_remat.units import format_bytes

    return format_bytes(n)


__all__ = [
    "BACKWARD",
    "FORWARD",
    "RECOMPUTE",
    "EstimateResult",
    "LiveTensor",
    "MemoryEstimate",
    "ScopeMemory",
    "Step",
    "check_dims",
    "estimate",
    "estimate_emulated",
    "estimate_graph",
    "estimate_original",
    "estimate_rewritten",
    "memory_estimate",
]
