"""Compare two training graphs: memory and time side by side, and whether they compute the same.

:func:`compare` measures graph A (usually the original) and graph B (the rewrite) with the same
inputs, parameters and seed (:func:`~.measure.measure` for what each figure means), reports B/A
ratios, and checks equivalence on the first step's outputs: the loss (and any other graph output
but the accumulators' bool flags) and every parameter gradient (``<param>_grad``, read from the
gradient accumulation buffers the step writes in place), bit for bit by default
(``atol = rtol = 0``: same shape, dtype and bytes), or within ``|b - a| <= atol + rtol * |a|``.
A recompute rewrite that replays dropout masks and keeps onnxruntime from merging its clones is
bit-identical to the original.

Parameters: ``checkpoint=`` for both, else each graph's own artifacts checkpoint, else the
other's (a rewritten graph written as a bare file next to nothing), else synthesized (the same
values for both). Data inputs: synthesized from graph A and the seed, or read from ``inputs``;
B must take the same data inputs and parameters.

JSON (:meth:`Comparison.to_json`, ``onnx-remat compare --json``)::

    {
      "a": { ...measurement of A, as onnx-remat measure --json... },
      "b": { ...measurement of B... },
      "ratios": {                      # B / A; null where either is unknown or A is zero
        "planned_peak_bytes": 0.33, "arena_peak_bytes": 0.33, "live_peak_bytes": 0.34,
        "step_time_s": 1.21           # of the medians
      },
      "equal": true,                   # every common output equal, and the same outputs
      "atol": 0.0, "rtol": 0.0,
      "max_abs_diff": {"<loss output>": 0.0, "blocks.0.y_grad": 0.0, ...},
                                       # per output of A (loss first); null: shapes differ or
                                       # missing in B
      "mismatched": ["..."],           # outputs that are not equal (within tolerance)
      "only_in_a": [], "only_in_b": [], # outputs one graph has and the other has not
      "equality_run": "first_step",    # outputs compared: of the first measured step, or
                                       # "single_thread": of a one-thread step of each graph,
                                       # when either graph's outputs varied run to run, holds
                                       # an op known to (GatherGrad), or to confirm a mismatch
      "by_design": null,               # B is a dropout="seed" rewrite: why it is not compared
                                       # with A itself (then "reference" and "mask_check" say
                                       # what was checked instead)
      "reference": "A",                # what B's outputs are compared with: "A", or "A with B's
                                       # dropout seeds" (A's Dropouts given B's seeds)
      "mask_check": null | {           # dropout="seed": each redraw against the forward pass
        "steps": 3, "equal": true, "pairs": 20,
        "mismatched": [{"step": 2, "dropout": "...", "what": "mask", "by": "..."}, ...]
      }
    }

A ``dropout="seed"`` rewrite (:mod:`onnx_remat.remat.seed_check`) draws other masks than the
original, so its loss and gradients differ from A's by design. Then ``equal`` says that they are
bit-identical to those of A with B's seeds (one single-threaded step of each), and that in each of
``MASK_CHECK_STEPS`` steps every recomputed mask (and cloned Dropout output) equals the forward
one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx

from onnx_remat.errors import RematError
from onnx_remat.graph.kernel_workarounds import fix_grouped_conv_grads
from onnx_remat.model_io import check_dim_names
from onnx_remat.remat.seed_check import seeded_dropouts, seeded_reference, with_mask_outputs
from onnx_remat.runtime.inputs import check_same_inputs, classify_inputs, prepare_feeds
from onnx_remat.runtime.measure import (
    Measurement,
    ProgressCallback,
    check_run_args,
    measure_prepared,
    reference_outputs,
    step_outputs,
)
from onnx_remat.runtime.prepared import (
    FORWARD_ONLY_NOTE,
    ModelSource,
    PreparedModel,
    Workdir,
    check_checkpoint,
    model_source,
)


@dataclass
class Comparison:
    """Two measurements, B/A ratios, and the equivalence verdict per output."""

    a: Measurement
    b: Measurement
    ratios: dict[str, float | None]
    equal: bool
    atol: float
    rtol: float
    max_abs_diff: dict[str, float | None]
    mismatched: list[str] = field(default_factory=list)
    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)
    equality_run: str = "first_step"
    by_design: str | None = None
    reference: str = "A"
    mask_check: MaskCheck | None = None

    def to_json(self) -> dict:
        """The JSON object documented in this module's docstring."""
        return {
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "ratios": self.ratios,
            "equal": self.equal,
            "atol": self.atol,
            "rtol": self.rtol,
            "max_abs_diff": self.max_abs_diff,
            "mismatched": self.mismatched,
            "only_in_a": self.only_in_a,
            "only_in_b": self.only_in_b,
            "equality_run": self.equality_run,
            "by_design": self.by_design,
            "reference": self.reference,
            "mask_check": self.mask_check.to_json() if self.mask_check is not None else None,
        }


MASK_CHECK_STEPS = 3
BY_DESIGN = (
    "not bit-identical by design: B is a dropout=seed rewrite, whose Dropouts draw from seeds of their own "
    "(another random stream than A's)"
)


@dataclass
class MaskCheck:
    """Forward and recomputed dropout masks (and cloned Dropout outputs) of a seed-mode rewrite,
    compared in each of ``steps`` consecutive steps."""

    steps: int
    pairs: int
    mismatched: list[dict] = field(default_factory=list)  # {"step", "dropout", "what", "by"}

    @property
    def equal(self) -> bool:
        return self.pairs > 0 and not self.mismatched

    def to_json(self) -> dict:
        return {"steps": self.steps, "equal": self.equal, "pairs": self.pairs, "mismatched": self.mismatched}


# Kernels whose CPU results depend on thread scheduling (accumulations into shared rows).
NONDETERMINISTIC_OPS = frozenset({"GatherGrad", "GatherElementsGrad", "GatherNDGrad"})


def nondeterministic_ops(model: onnx.ModelProto) -> list[str]:
    """Op types in ``model`` whose multithreaded CPU results may vary run to run."""
    return sorted({n.op_type for n in model.graph.node if n.op_type in NONDETERMINISTIC_OPS})


def ratio(b: float | None, a: float | None) -> float | None:
    """``b / a``, or None where either is unknown or ``a`` is zero."""
    if a is None or b is None or a == 0:
        return None
    return b / a


def ratios(a: Measurement, b: Measurement) -> dict[str, float | None]:
    """B/A for the peaks and the median step time."""
    return {
        "planned_peak_bytes": ratio(b.planned_peak_bytes, a.planned_peak_bytes),
        "arena_peak_bytes": ratio(b.arena_peak_bytes, a.arena_peak_bytes),
        "live_peak_bytes": ratio(b.live_peak_bytes, a.live_peak_bytes),
        "step_time_s": ratio(b.step_time_s.median, a.step_time_s.median),
    }


def max_abs_diff(x: np.ndarray, y: np.ndarray) -> float | None:
    """Largest ``|x - y|`` (0.0 for empty arrays); None when shapes differ; inf where NaNs disagree."""
    if x.shape != y.shape:
        return None
    if x.size == 0:
        return 0.0
    if x.dtype.kind in "fc" or y.dtype.kind in "fc":
        xf, yf = x.astype(np.float64), y.astype(np.float64)
        nan_x, nan_y = np.isnan(xf), np.isnan(yf)
        if np.any(nan_x != nan_y):
            return float("inf")
        d = np.abs(np.where(nan_x, 0.0, xf) - np.where(nan_y, 0.0, yf))
        return float(d.max())
    return float(np.abs(x.astype(np.int64) - y.astype(np.int64)).max()) if x.dtype.kind in "iub" else None


def outputs_equal(x: np.ndarray, y: np.ndarray, atol: float = 0.0, rtol: float = 0.0) -> bool:
    """Bit for bit (same shape, dtype and bytes) when both tolerances are 0, else ``|y - x| <= atol + rtol*|x|``."""
    if x.shape != y.shape:
        return False
    if atol == 0 and rtol == 0:
        return x.dtype == y.dtype and np.ascontiguousarray(x).tobytes() == np.ascontiguousarray(y).tobytes()
    if x.dtype.kind not in "fc" and y.dtype.kind not in "fc":
        return bool(np.array_equal(x, y))
    return bool(np.allclose(y, x, atol=atol, rtol=rtol, equal_nan=False))


def compare_outputs(
    a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray], atol: float = 0.0, rtol: float = 0.0
) -> tuple[bool, dict[str, float | None], list[str], list[str], list[str]]:
    """``(equal, max_abs_diff, mismatched, only_in_a, only_in_b)`` over the outputs of two steps."""
    diffs: dict[str, float | None] = {}
    mismatched: list[str] = []
    only_a = [k for k in a if k not in b]
    only_b = [k for k in b if k not in a]
    for name, x in a.items():
        if name not in b:
            diffs[name] = None
            continue
        y = b[name]
        diffs[name] = max_abs_diff(x, y)
        if not outputs_equal(x, y, atol, rtol):
            mismatched.append(name)
    equal = not mismatched and not only_a and not only_b
    return equal, diffs, mismatched, only_a, only_b


def compare(
    a: str | os.PathLike | onnx.ModelProto,
    b: str | os.PathLike | onnx.ModelProto,
    *,
    device: str = "cpu",
    atol: float = 0.0,
    rtol: float = 0.0,
    steps: int = 3,
    warmup: int = 1,
    dims: Mapping[str, int] | None = None,
    inputs: str | os.PathLike | Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
    int_ranges: Mapping[str, tuple[int, int]] | None = None,
    checkpoint: str | os.PathLike | None = None,
    live: bool = True,
    progress: ProgressCallback | None = None,
) -> Comparison:
    """Measure A and B with the same feeds and seed; compare their figures and first-step outputs.

    ``a`` and ``b``: training graph files, artifacts directories or ModelProtos (written to a
    temporary folder). Other arguments as for :func:`~.measure.measure`. Gradients that differ
    are a result (``equal`` False), not an exception; bad inputs raise RematError.
    """
    check_run_args(device, steps, warmup)
    if atol < 0 or rtol < 0:
        raise RematError(f"tolerances must not be negative (atol={atol}, rtol={rtol})")
    with Workdir("onnx-remat-compare-") as tmp:
        src_a = model_source(a, checkpoint, tmp, "a")
        src_b = model_source(b, checkpoint, tmp, "b")
        notes_b: list[str] = []
        notes_a: list[str] = []
        if src_b.checkpoint is None and src_a.checkpoint is not None:
            src_b.checkpoint = src_a.checkpoint
            notes_b.append(f"parameters from A's checkpoint {src_a.checkpoint}")
        elif src_a.checkpoint is None and src_b.checkpoint is not None:
            src_a.checkpoint = src_b.checkpoint
            notes_a.append(f"parameters from B's checkpoint {src_b.checkpoint}")
        for src in (src_a, src_b):
            check_dim_names(src.model, dims, src.label)
            check_checkpoint(src.checkpoint)
        check_same_inputs(classify_inputs(src_a.model), classify_inputs(src_b.model))
        feeds = prepare_feeds(
            src_a.model,
            dims=dims,
            inputs=inputs,
            seed=seed,
            int_ranges=int_ranges,
            synthesize_parameters=src_a.checkpoint is None,
        )
        path = feeds.save(tmp / "feeds.npz")

        def run(src: ModelSource, label: str) -> tuple[Measurement, dict[str, np.ndarray] | None]:
            return measure_prepared(
                PreparedModel(src, feeds, path),
                device=device,
                steps=steps,
                warmup=warmup,
                seed=seed,
                live=live,
                progress=progress,
                save_outputs=True,
                workdir=tmp / label.lower(),
                tag=label,
            )

        ma, out_a = run(src_a, "A")
        mb, out_b = run(src_b, "B")
        ma.notes.extend(notes_a + ([FORWARD_ONLY_NOTE] if src_a.forward_only else []))
        mb.notes.extend(notes_b + ([FORWARD_ONLY_NOTE] if src_b.forward_only else []))
        if out_a is None or out_b is None:  # pragma: no cover - the worker always writes them
            raise RematError("a measuring process returned no outputs to compare")
        seeds = seeded_dropouts(src_b.model)
        if seeds:
            return _compare_seeded(
                ma,
                mb,
                src_a,
                src_b,
                seeds,
                feeds,
                path,
                tmp,
                device=device,
                seed=seed,
                atol=atol,
                rtol=rtol,
                progress=progress,
            )

        # A grouped 1-D ConvGrad writes past its output in onnxruntime 1.19 (graph/kernel_workarounds.py):
        # where either graph has one, both are compared in the form onnxruntime computes correctly.
        fixed_a, fixed_b = (_in_2d_form(src, tmp, tag) for src, tag in ((src_a, "a_2d"), (src_b, "b_2d")))
        reference = "A"
        if fixed_a is not src_a or fixed_b is not src_b:
            reference = "A, its grouped 1-D ConvGrads in the 2-D form"
            ma.notes.append(CONV_GRAD_NOTE)

        def single_threaded():
            return (
                reference_outputs(
                    PreparedModel(fixed_a, feeds, path),
                    device=device,
                    seed=seed,
                    workdir=tmp / "a1",
                    progress=progress,
                    tag="A",
                ),
                reference_outputs(
                    PreparedModel(fixed_b, feeds, path),
                    device=device,
                    seed=seed,
                    workdir=tmp / "b1",
                    progress=progress,
                    tag="B",
                ),
            )

        equality_run = "first_step"
        if (
            reference != "A"
            or ma.unstable_outputs
            or mb.unstable_outputs
            or nondeterministic_ops(src_a.model)
            or nondeterministic_ops(src_b.model)
        ):
            # Multithreaded kernels can make outputs vary run to run (seen: GatherGrad with 2
            # threads): compare one-thread steps instead, which are deterministic.
            equality_run = "single_thread"
            out_a, out_b = single_threaded()
        equal, diffs, mismatched, only_a, only_b = compare_outputs(out_a, out_b, atol, rtol)
        if not equal and equality_run == "first_step":
            # Confirm a mismatch on deterministic steps before reporting it: a kernel not known
            # to vary with threads may still have, by chance identically in A's two steps.
            equality_run = "single_thread"
            out_a, out_b = single_threaded()
            equal, diffs, mismatched, only_a, only_b = compare_outputs(out_a, out_b, atol, rtol)
        return Comparison(
            a=ma,
            b=mb,
            ratios=ratios(ma, mb),
            equal=equal,
            atol=atol,
            rtol=rtol,
            max_abs_diff=diffs,
            mismatched=mismatched,
            only_in_a=only_a,
            only_in_b=only_b,
            equality_run=equality_run,
            reference=reference,
        )


CONV_GRAD_NOTE = (
    "compared with its grouped 1-D ConvGrad nodes in the 2-D form: onnxruntime 1.19's CPU kernel writes past "
    "their output, so as written the gradients depend on where tensors live"
)


def _in_2d_form(src: ModelSource, tmp, tag: str) -> ModelSource:
    """``src``, or a copy of it with its grouped 1-D ConvGrads in the 2-D form, if it has any."""
    fixed, names = fix_grouped_conv_grads(src.model)
    if not names:
        return src
    copy = model_source(fixed, src.checkpoint, tmp, tag)
    copy.checkpoint = src.checkpoint
    return copy


def _compare_seeded(
    ma: Measurement,
    mb: Measurement,
    src_a: ModelSource,
    src_b: ModelSource,
    seeds: dict[str, int],
    feeds,
    feeds_path,
    tmp,
    *,
    device: str,
    seed: int,
    atol: float,
    rtol: float,
    progress: ProgressCallback | None,
) -> Comparison:
    """The verdict for a ``dropout="seed"`` rewrite B (see the module docstring)."""
    reference = model_source(seeded_reference(src_a.model, seeds), src_a.checkpoint, tmp, "a_seeded")
    reference.checkpoint = src_a.checkpoint
    out_ref = reference_outputs(
        PreparedModel(reference, feeds, feeds_path),
        device=device,
        seed=seed,
        workdir=tmp / "a_seeded",
        progress=progress,
        tag="A",
    )
    out_b = reference_outputs(
        PreparedModel(src_b, feeds, feeds_path),
        device=device,
        seed=seed,
        workdir=tmp / "b1",
        progress=progress,
        tag="B",
    )
    equal, diffs, mismatched, only_a, only_b = compare_outputs(out_ref, out_b, atol, rtol)

    check_model, pairs = with_mask_outputs(src_b.model)
    check = model_source(check_model, src_b.checkpoint, tmp, "b_masks")
    check.checkpoint = src_b.checkpoint
    steps = step_outputs(
        PreparedModel(check, feeds, feeds_path),
        device=device,
        seed=seed,
        workdir=tmp / "b_masks",
        progress=progress,
        tag="B",
        steps=MASK_CHECK_STEPS,
    )
    masks = MaskCheck(steps=MASK_CHECK_STEPS, pairs=len(pairs))
    for k, outputs in enumerate(steps, start=1):
        for pair in pairs:
            x, y = outputs.get(pair.forward), outputs.get(pair.recomputed)
            if x is None or y is None or not outputs_equal(x, y):
                masks.mismatched.append({"step": k, "dropout": pair.dropout, "what": pair.what, "by": pair.by})
    return Comparison(
        a=ma,
        b=mb,
        ratios=ratios(ma, mb),
        equal=equal and masks.equal,
        atol=atol,
        rtol=rtol,
        max_abs_diff=diffs,
        mismatched=mismatched,
        only_in_a=only_a,
        only_in_b=only_b,
        equality_run="single_thread",
        by_design=BY_DESIGN,
        reference="A with B's dropout seeds",
        mask_check=masks,
    )
