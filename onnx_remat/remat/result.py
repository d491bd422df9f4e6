"""What :func:`onnx_remat.apply` returns: :class:`ApplyResult`, the rewritten graph and how it was made.

Its own module, below both the function that makes it (:mod:`onnx_remat.remat.apply`) and the
budget planner that makes one too (:mod:`onnx_remat.remat.budget`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from onnx_remat.analysis.model import ModelAnalysis
from onnx_remat.errors import RematError
from onnx_remat.model_io import remat_output, save_derived
from onnx_remat.remat.plan import RecomputePlan
from onnx_remat.remat.rewrite import RewriteResult

if TYPE_CHECKING:
    from onnx_remat.memory import MemoryEstimate
    from onnx_remat.remat.budget import BudgetResult
    from onnx_remat.scheduling.schedule import ScheduleResult


@dataclass
class ApplyResult:
    """The rewritten training graph and what was done to it.

    ``model`` is the new ``onnx.ModelProto``; ``plan`` the segments (with their stored bytes
    released) and what was skipped; ``rewrite`` the clones and barriers added per segment (its
    ``model`` is ``model``: the rewrite as written, after the order stage); ``analysis`` describes
    the input graph.
    """

    model: onnx.ModelProto
    plan: RecomputePlan
    rewrite: RewriteResult
    analysis: ModelAnalysis
    notes: list[str] = field(default_factory=list)
    estimate_before: MemoryEstimate | None = None  # the original graph, when the peak was checked
    estimate_after: MemoryEstimate | None = None  # the rewrite (scheduled, when it was)
    schedule: ScheduleResult | None = None  # the memory schedule of the rewrite (None: not scheduled)
    budget: BudgetResult | None = None  # how a memory budget was met (apply(..., budget=...))

    @property
    def released_bytes(self) -> int:
        """Stored activation bytes the rewrite releases after the forward pass (known sizes only)."""
        return self.plan.released_bytes

    @property
    def clone_count(self) -> int:
        return self.rewrite.clone_count

    def default_output(self) -> Path:
        """Where :meth:`save` writes without a path: ``x.remat.onnx`` or ``<artifacts>_remat/`` in the
        current directory (never beside the input, which may be read-only or a folder others scan)."""
        src = self.analysis.source
        if src is None:
            raise RematError("the model was given in memory: give an output path")
        return remat_output(src.artifacts_dir or src.path)[0]

    def save(self, path: str | os.PathLike | None = None, *, force: bool = False) -> Path:
        """Write the result atomically; returns where.

        From an artifacts directory the output is a complete artifacts directory (checkpoint,
        eval and optimizer models copied) unless ``path`` ends in ``.onnx``; otherwise a model
        file. Replacing an existing output needs ``force``; the input files are never replaced
        (:func:`onnx_remat.model_io.check_output`).
        """
        out = Path(path) if path is not None else self.default_output()
        return save_derived(self.analysis.source, self.model, out, force=force)

    @property
    def dropout(self) -> str:
        """How dropout masks are kept: ``packed``, ``seed`` or ``byte`` (see :func:`apply`)."""
        return self.plan.dropout

    @property
    def mask_bytes(self) -> int:
        """Bytes the rewrite stores for the dropout masks its segments replay (each mask once)."""
        return self.plan.mask_bytes

    def summary(self) -> dict:
        """JSON-ready summary: the model, counts and one entry per segment (with its ``masks`` and
        ``mask_bytes``: the dropout masks its clones replay and the bytes stored for them)."""
        return {
            "model": self.analysis.name,
            "graph": self.analysis.graph.counts(),
            "scope_source": self.analysis.scopes.source,
            "segments": [s.summary() for s in self.rewrite.segments],
            "skipped": [{"label": s.label, "reason": s.reason} for s in self.plan.skipped],
            "notes": self.plan.notes + self.notes,
            "cloned_nodes": self.clone_count,
            "released_bytes": self.released_bytes,
            "schedule": self.schedule.summary() if self.schedule is not None else None,
            "dropout": self.dropout,
            "masks": len(self.plan.masks),
            "mask_bytes": self.mask_bytes,
            "dropout_seeds": dict(self.rewrite.dropout_seeds),
            **({"budget": self.budget.summary()} if self.budget is not None else {}),
        }
