"""``onnx_remat.apply``: select, plan and rewrite in one call, then save the result safely.

>>> import onnx_remat
>>> result = onnx_remat.apply("models/artifacts/blocks10", scopes=["Block"])
>>> result.save("blocks10_remat")          # a complete artifacts directory
>>> result.released_bytes                  # stored activation bytes released, per the plan

``onnx-remat apply MODEL --scope PATTERN [-o OUT]`` is this function plus printing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from .analysis import ModelAnalysis, ModelLike, analyze_model
from .errors import RematError
from .model_io import TRAINING_MODEL, save_model, write_artifacts
from .validity import check_runtime_support
from .ort_optimizer import execution_order
from .random_ops import is_random
from .recompute import RecomputeRewrite, RewriteResult
from .selection import Planner, RecomputePlan, Selection


@dataclass
class ApplyResult:
    """The rewritten training graph and what was done to it.

    ``model`` is the new ``onnx.ModelProto``; ``plan`` the segments (with their stored bytes
    released) and what was skipped; ``rewrite`` the clones and barriers added per segment;
    ``analysis`` describes the input graph.
    """

    model: onnx.ModelProto
    plan: RecomputePlan
    rewrite: RewriteResult
    analysis: ModelAnalysis
    notes: list[str] = field(default_factory=list)

    @property
    def released_bytes(self) -> int:
        """Stored activation bytes the rewrite releases after the forward pass (known sizes only)."""
        return self.plan.released_bytes

    @property
    def clone_count(self) -> int:
        return self.rewrite.clone_count

    def default_output(self) -> Path:
        """Where :meth:`save` writes without a path: ``x.remat.onnx`` or ``<artifacts>_remat/``."""
        src = self.analysis.source
        if src is None:
            raise RematError("the model was given in memory: give an output path")
        if src.artifacts_dir is not None and src.path.name == TRAINING_MODEL:
            return src.artifacts_dir.with_name(src.artifacts_dir.name + "_remat")
        return src.path.with_name(src.path.name.removesuffix(".onnx") + ".remat.onnx")

    def save(self, path: str | os.PathLike | None = None, *, force: bool = False) -> Path:
        """Write the result atomically; returns where.

        From an artifacts directory the output is a complete artifacts directory (checkpoint,
        eval and optimizer models copied) unless ``path`` ends in ``.onnx``; otherwise a model
        file. Replacing an existing output, or the input, needs ``force``.
        """
        out = Path(path) if path is not None else self.default_output()
        src = self.analysis.source
        inputs = (src.path,) if src is not None else ()
        external = src.external_data if src is not None else None
        if src is not None and src.artifacts_dir is not None and out.suffix != ".onnx":
            return write_artifacts(src.artifacts_dir, out, self.model, force=force)
        return save_model(self.model, out, force=force, inputs=inputs, external_data=external or None)

    def summary(self) -> dict:
        """JSON-ready summary: the model, counts and one entry per segment."""
        return {
            "model": self.analysis.name,
            "graph": self.analysis.graph.counts(),
            "scope_source": self.analysis.scopes.source,
            "segments": [s.summary() for s in self.rewrite.segments],
            "skipped": [{"label": s.label, "reason": s.reason} for s in self.plan.skipped],
            "notes": self.plan.notes + self.notes,
            "cloned_nodes": self.clone_count,
            "released_bytes": self.released_bytes,
        }


def _has_random_ops(analysis: ModelAnalysis) -> bool:
    return sum(1 for n in analysis.graph.forward_nodes if is_random(n)) > 1


def _as_list(value: str | Iterable[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    out: list[str] = []
    for item in value:
        out.extend(p.strip() for p in item.split(",") if p.strip())
    return out


def plan(
    analysis: ModelAnalysis,
    *,
    scopes: str | Iterable[str] | None = None,
    op_types: str | Iterable[str] | None = None,
    nodes: str | Iterable[str] | None = None,
    recompute_outputs: bool = False,
) -> RecomputePlan:
    """The recompute plan for a selection, without rewriting (used by ``apply`` and ``estimate``)."""
    selection = Selection(
        scopes=_as_list(scopes),
        op_types=_as_list(op_types),
        nodes=list(nodes) if isinstance(nodes, (list, tuple)) else _as_list(nodes),
        recompute_outputs=recompute_outputs,
    )
    return Planner(analysis.graph, analysis.scopes, analysis.sizes).plan(selection)


def apply(
    model: ModelLike,
    *,
    scopes: str | Iterable[str] | None = None,
    op_types: str | Iterable[str] | None = None,
    nodes: str | Iterable[str] | None = None,
    recompute_outputs: bool = False,
    dims: dict[str, int] | None = None,
    eval_model: str | os.PathLike | onnx.ModelProto | None = None,
) -> ApplyResult:
    """Recompute the selected activations of a training graph; returns an :class:`ApplyResult`.

    ``model``: a training graph file, an artifacts directory, or an ``onnx.ModelProto``.
    Select with ``scopes`` (module paths, globs or class names, e.g. ``"Block"`` or
    ``"blocks.*"``), ``op_types`` (``"Softmax,Gelu"``) and/or ``nodes`` (node names);
    ``recompute_outputs`` merges adjacent recomputed scopes (MindSpore's ``output_recompute``).
    ``dims`` binds symbolic dimensions for the memory figures. Nothing is written: call
    :meth:`ApplyResult.save`. Raises :class:`~onnx_remat.errors.RematError` on bad input or
    a selection that matches nothing.
    """
    analysis = analyze_model(model, eval_model=eval_model, dims=dims)
    recompute_plan = plan(analysis, scopes=scopes, op_types=op_types, nodes=nodes, recompute_outputs=recompute_outputs)
    order = execution_order(analysis.model, analysis.sizes) if _has_random_ops(analysis) else None
    rewrite = RecomputeRewrite(random_order=order)(analysis.graph, recompute_plan)
    check_runtime_support(rewrite.model, "rewritten model")
    notes = []
    unknown = recompute_plan.unknown_sizes
    if unknown:
        symbols = analysis.sizes.unbound_symbols(unknown)
        hint = f" (bind {', '.join(sorted(symbols))} with --dim name=value)" if symbols else ""
        notes.append(f"{len(unknown)} tensors of unknown size are not counted in the bytes released{hint}")
    return ApplyResult(model=rewrite.model, plan=recompute_plan, rewrite=rewrite, analysis=analysis, notes=notes)
