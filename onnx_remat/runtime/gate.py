"""``onnx_remat.runtime.gate``: a regression gate for CI. Rewrite, measure, compare with a stored baseline.

>>> from onnx_remat.runtime.gate import check
>>> v = check("models/artifacts/blocks10", scopes="Block", baseline="models/baselines/blocks10.json")
>>> v.passed, [c.name for c in v.failures]

``onnx-remat check MODEL --scope PATTERN --baseline FILE`` is this function plus printing.

What it does: applies the recompute rewrite in memory (:func:`onnx_remat.remat.apply`), measures the
original and the rewritten graph with the same inputs, parameters and seed
(:func:`onnx_remat.runtime.compare.compare`, each in fresh processes), and compares the figures
with the baseline file. Gated (deterministic on a given onnxruntime build, so a CI machine gives
the figures of a laptop):

==========================  =====================================================================
check                       fails when
==========================  =====================================================================
``gradients``               loss or any gradient of the rewrite differs from the original's
                            (bit for bit unless ``atol``/``rtol``)
``original_planned_peak``   the original graph's planned peak rose by more than
                            ``max_peak_increase`` (2%): the *model* changed (or onnxruntime)
``rewritten_planned_peak``  the rewritten graph's planned peak rose by more than
                            ``max_peak_increase``; with the original unchanged: the *rewrite*
                            regressed
``segments``                the number of recomputed segments differs from the baseline's
``clones``                  the number of clone nodes the rewrite adds differs
``barriers``                the number of barrier nodes differs
``clones_kept``             onnxruntime kept fewer clones than in the baseline (merged back by
                            common-subexpression elimination, or fused away)
``barriers_kept``           onnxruntime kept fewer barriers
``clones_late``             the baseline's clones all ran in the backward pass and now some ran
                            before their trigger
``step_time_ratio``         only with ``check_time``: rewritten / original median step time
                            (measured in the same run, so the machine's speed cancels) rose by
                            more than ``max_time_increase`` (25%) over the baseline's ratio
==========================  =====================================================================

Shown, not gated: the planned-peak ratio, the step times (and the time ratio without
``check_time``), live peaks when ``live=True``. The planned peak is the memory-pattern block of
a step: byte-identical run to run, but it depends on the onnxruntime build and version, so
record the baseline with the runtime CI uses (the baseline stores both versions and a verdict
notes when they differ).

Baseline file (JSON, written atomically by ``update=True``; refused when gradients differ)::

    {
      "schema": "onnx-remat-baseline/1",
      "recorded": "2025-01-01T12:00:00+00:00",
      "onnx_remat": "0.1.0", "onnxruntime": "1.19.2",
      "model": "models/artifacts/blocks10",       # as given when recorded (informational)
      "device": "cpu",
      "selection": {"scopes": ["Block"], "op_types": [], "nodes": [], "recompute_outputs": false},
      "settings": {"seed": 0, "dims": {}, "atol": 0.0, "rtol": 0.0},
      "figures": {                                 # see Verdict.figures
        "original_planned_peak_bytes": 225443840, "rewritten_planned_peak_bytes": 74448896,
        "planned_peak_ratio": 0.33, "segments": 10, "clones": 100, "barriers": 10,
        "clones_kept": 71, "barriers_kept": 10, "clones_ran": 71, "clones_late": true,
        "gradients_equal": true, "original_step_time_s": 0.61, "rewritten_step_time_s": 0.68,
        "step_time_ratio": 1.11,
        "original_live_peak_bytes": null, "rewritten_live_peak_bytes": null   # live=True only
      }
    }

Verdict JSON (:meth:`Verdict.to_json`, ``onnx-remat check --json``)::

    {
      "schema": "onnx-remat-check/1",
      "passed": true, "result": "PASSED",          # or false / "FAILED"
      "model": "models/artifacts/blocks10", "baseline": "models/baselines/blocks10.json",
      "baseline_updated": false,                   # true: update=True wrote the file
      "selection": {...}, "device": "cpu", "seed": 0, "steps": 1, "warmup": 1,
      "thresholds": {"max_peak_increase": 0.02, "max_time_increase": 0.25, "check_time": false,
                     "atol": 0.0, "rtol": 0.0},
      "checks": [{"name": "rewritten_planned_peak", "what": "planned peak, rewritten",
                  "baseline": 74448896, "now": 74448896, "limit": 75937873,
                  "threshold": "<= baseline +2%", "unit": "bytes",
                  "status": "PASS" | "FAIL" | "INFO", "gated": true, "message": ""}, ...],
      "failures": ["rewritten_planned_peak", ...],  # names of FAILed checks
      "diagnosis": ["..."],                        # what the failures point at, one line each
      "figures": {...},                            # this run, as in the baseline file
      "baseline_figures": {...} | null,
      "versions": {"onnx_remat": "...", "onnxruntime": "...",
                   "baseline_onnx_remat": "...", "baseline_onnxruntime": "..."},
      "comparison": {...},                         # onnx-remat compare --json of this run
      "duration_s": 9.1
    }

Errors: a missing or unreadable baseline (without ``update``), a baseline recorded for another
selection or device, bad thresholds: :class:`~onnx_remat.errors.UsageError` (CLI exit status 2).
onnxruntime missing, CUDA asked for without a GPU: :class:`~onnx_remat.errors.EnvironmentProblem`
(3). A failed check is a result (``Verdict.passed`` False, CLI exit status 1), not an exception.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from onnx_remat import __version__
from onnx_remat.errors import UsageError, one_line
from onnx_remat.model_io import check_output, make_parents, write_file

BASELINE_SCHEMA = "onnx-remat-baseline/1"
VERDICT_SCHEMA = "onnx-remat-check/1"
PASS, FAIL, INFO = "PASS", "FAIL", "INFO"


@dataclass
class Check:
    """One line of the verdict: what was compared, the baseline's and this run's value, the outcome.

    ``status``: ``PASS``/``FAIL`` for gated checks, ``INFO`` for figures shown but not gated
    (and for gated figures the baseline lacks). ``limit`` is the largest (or smallest) value that
    passes, where the threshold is numeric.
    """

    name: str
    what: str
    baseline: Any
    now: Any
    threshold: str
    status: str
    gated: bool
    unit: str = ""
    limit: float | int | None = None
    message: str = ""

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "what": self.what,
            "baseline": self.baseline,
            "now": self.now,
            "limit": self.limit,
            "threshold": self.threshold,
            "unit": self.unit,
            "status": self.status,
            "gated": self.gated,
            "message": self.message,
        }


@dataclass
class Verdict:
    """The outcome of :func:`check` (see the module docstring for the JSON form)."""

    passed: bool
    model: str
    baseline_path: Path
    selection: dict
    device: str
    seed: int
    steps: int
    warmup: int
    thresholds: dict
    checks: list[Check]
    figures: dict
    baseline_figures: dict | None
    baseline_updated: bool
    diagnosis: list[str]
    versions: dict
    comparison: Any  # onnx_remat.runtime.compare.Comparison
    duration_s: float = 0.0

    @property
    def failures(self) -> list[Check]:
        """The checks that failed."""
        return [c for c in self.checks if c.status == FAIL]

    def to_json(self) -> dict:
        """The JSON object documented in the module docstring."""
        return {
            "schema": VERDICT_SCHEMA,
            "passed": self.passed,
            "result": "PASSED" if self.passed else "FAILED",
            "model": self.model,
            "baseline": str(self.baseline_path),
            "baseline_updated": self.baseline_updated,
            "selection": self.selection,
            "device": self.device,
            "seed": self.seed,
            "steps": self.steps,
            "warmup": self.warmup,
            "thresholds": self.thresholds,
            "checks": [c.to_json() for c in self.checks],
            "failures": [c.name for c in self.failures],
            "diagnosis": self.diagnosis,
            "figures": self.figures,
            "baseline_figures": self.baseline_figures,
            "versions": self.versions,
            "comparison": self.comparison.to_json() if self.comparison is not None else None,
            "duration_s": round(self.duration_s, 2),
        }


# -- the baseline file ---------------------------------------------------------------------------


def _selection(scopes, op_types, nodes, recompute_outputs) -> dict:
    from onnx_remat.remat.apply import as_list

    node_list = list(nodes) if isinstance(nodes, (list, tuple)) else as_list(nodes)
    return {
        "scopes": as_list(scopes),
        "op_types": as_list(op_types),
        "nodes": node_list,
        "recompute_outputs": bool(recompute_outputs),
    }


_COUNT_FIGURES = ("segments", "clones", "barriers", "clones_kept", "barriers_kept", "clones_ran")
_BOOL_FIGURES = ("clones_late", "gradients_equal")
_SELECTION_LISTS = ("scopes", "op_types", "nodes")


def _figure_problem(key: str, value) -> str | None:
    """Why ``value`` cannot be the baseline's figure ``key`` (None when it can)."""
    if value is None:
        return None
    if key in _BOOL_FIGURES:
        return None if isinstance(value, bool) else f"{value!r}, not true/false"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{value!r}, not a number"
    if not math.isfinite(value):
        return f"{value!r}, not a finite number"
    if value < 0:
        return f"{value!r}, a negative number"
    if (key in _COUNT_FIGURES or key.endswith("_bytes")) and value != int(value):
        return f"{value!r}, not a whole number"
    return None


def validate_baseline(data, path: str | os.PathLike) -> dict:
    """Check the shape of a parsed baseline file; returns it. Raises :class:`UsageError` naming the
    first field that is wrong (a string ``selection``, a figure that is text or NaN, ...) before
    anything is measured."""
    p = Path(path)
    again = "record it again with --update-baseline"
    if not isinstance(data, dict) or data.get("schema") != BASELINE_SCHEMA or not isinstance(data.get("figures"), dict):
        raise UsageError(f"{p}: not an onnx-remat baseline (schema {BASELINE_SCHEMA!r} expected); {again}")
    sel = data.get("selection", {})
    if not isinstance(sel, dict):
        raise UsageError(f"{p}: 'selection' is {type(sel).__name__} {sel!r}, not an object; {again}")
    for key in _SELECTION_LISTS:
        value = sel.get(key, [])
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise UsageError(f"{p}: selection.{key} is {value!r}, not a list of strings; {again}")
    if not isinstance(sel.get("recompute_outputs", False), bool):
        value = sel.get("recompute_outputs")
        raise UsageError(f"{p}: selection.recompute_outputs is {value!r}, not true/false; {again}")
    device = data.get("device", "cpu")
    if device not in ("cpu", "cuda"):
        raise UsageError(f"{p}: device is {device!r}, not cpu or cuda; {again}")
    for key, value in data["figures"].items():
        why = _figure_problem(str(key), value)
        if why is not None:
            raise UsageError(f"{p}: figures.{key} is {why}; {again}")
    return data


def read_baseline(path: str | os.PathLike) -> dict:
    """Load and check a baseline file (:func:`validate_baseline`). UsageError (exit 2) when missing,
    unreadable or malformed."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{p}: no such baseline; record one with --update-baseline")
    if not p.is_file():
        raise UsageError(f"{p}: not a regular file; give the baseline JSON file")
    try:
        data = json.loads(p.read_bytes().decode("utf-8"), parse_constant=_no_constants)
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else one_line(exc)
        raise UsageError(f"{p}: not a readable baseline ({why}); record it again with --update-baseline") from None
    return validate_baseline(data, p)


def _finite(obj):
    """NaN and infinities as null: a baseline must stay valid JSON and readable by :func:`read_baseline`."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def _no_constants(name: str):
    raise ValueError(f"{name} is not a number in JSON")


def write_baseline(path: str | os.PathLike, data: dict) -> Path:
    """Write a baseline atomically, replacing the old one (a temporary file in the same folder,
    then a rename); never over another input of the command (:func:`onnx_remat.model_io.check_output`)."""
    p = Path(path)
    text = json.dumps(_finite(data), indent=2, allow_nan=False) + "\n"
    write_file(p, text, force=True)
    return p


# -- figures -------------------------------------------------------------------------------------


def figures_of(comparison, result) -> dict:
    """The figures a baseline stores, from a Comparison (A original, B rewrite) and the ApplyResult."""
    a, b = comparison.a, comparison.b
    rw = b.rewrite
    return {
        "original_planned_peak_bytes": a.planned_peak_bytes,
        "rewritten_planned_peak_bytes": b.planned_peak_bytes,
        "planned_peak_ratio": comparison.ratios.get("planned_peak_bytes"),
        "segments": len(result.rewrite.segments),
        "clones": rw.clones_in_model,
        "barriers": rw.barriers_in_model,
        "clones_kept": rw.clones_kept,
        "barriers_kept": rw.barriers_kept,
        "clones_ran": rw.clones_ran,
        "clones_late": rw.all_late,
        "gradients_equal": comparison.equal,
        "original_step_time_s": a.step_time_s.median,
        "rewritten_step_time_s": b.step_time_s.median,
        "step_time_ratio": comparison.ratios.get("step_time_s"),
        "original_live_peak_bytes": a.live_peak_bytes,
        "rewritten_live_peak_bytes": b.live_peak_bytes,
    }


def _pct(x: float) -> str:
    return f"{x * 100:g}%"


def _increase_check(name, what, base, now, rel: float, unit: str, gated: bool = True) -> Check:
    """``now <= base * (1 + rel)``."""
    threshold = f"<= baseline +{_pct(rel)}"
    if not gated:
        return Check(name, what, base, now, threshold + " (not gated)", INFO, False, unit)
    if base is None:
        return Check(name, what, base, now, threshold, INFO, True, unit, message="no baseline figure")
    if now is None:
        return Check(name, what, base, now, threshold, FAIL, True, unit, message="not measured in this run")
    limit = base * (1 + rel)
    if unit == "bytes":
        limit = math.floor(limit)
    ok = now <= limit
    msg = "" if ok else f"+{(now / base - 1) * 100:.1f}% over the baseline" if base else "rose from 0"
    return Check(name, what, base, now, threshold, PASS if ok else FAIL, True, unit, limit, msg)


def _equal_check(name, what, base, now) -> Check:
    if base is None:
        return Check(name, what, base, now, "== baseline", INFO, True, "count", message="no baseline figure")
    ok = now == base
    return Check(
        name,
        what,
        base,
        now,
        "== baseline",
        PASS if ok else FAIL,
        True,
        "count",
        base,
        "" if ok else "the rewrite changed",
    )


def _at_least_check(name, what, base, now, message) -> Check:
    if base is None:
        return Check(name, what, base, now, ">= baseline", INFO, True, "count", message="no baseline figure")
    ok = now is not None and now >= base
    return Check(name, what, base, now, ">= baseline", PASS if ok else FAIL, True, "count", base, "" if ok else message)


def build_checks(
    now: dict,
    base: dict | None,
    *,
    max_peak_increase: float,
    max_time_increase: float,
    check_time: bool,
    tolerance: str,
) -> list[Check]:
    """The verdict lines: ``now`` against ``base`` (figures dicts; ``base`` None: nothing to compare)."""
    b = base or {}
    checks = [
        Check(
            "gradients",
            "loss and gradients equal",
            b.get("gradients_equal"),
            now["gradients_equal"],
            tolerance,
            PASS if now["gradients_equal"] else FAIL,
            True,
            "",
            message="" if now["gradients_equal"] else "the rewritten graph computes different gradients",
        ),
        _increase_check(
            "original_planned_peak",
            "planned peak, original",
            b.get("original_planned_peak_bytes"),
            now["original_planned_peak_bytes"],
            max_peak_increase,
            "bytes",
        ),
        _increase_check(
            "rewritten_planned_peak",
            "planned peak, rewritten",
            b.get("rewritten_planned_peak_bytes"),
            now["rewritten_planned_peak_bytes"],
            max_peak_increase,
            "bytes",
        ),
        Check(
            "planned_peak_ratio",
            "planned peak ratio",
            b.get("planned_peak_ratio"),
            now["planned_peak_ratio"],
            "shown",
            INFO,
            False,
            "ratio",
        ),
        _equal_check("segments", "segments recomputed", b.get("segments"), now["segments"]),
        _equal_check("clones", "clones in the rewrite", b.get("clones"), now["clones"]),
        _equal_check("barriers", "barriers in the rewrite", b.get("barriers"), now["barriers"]),
        _at_least_check(
            "clones_kept",
            "clones kept by onnxruntime",
            b.get("clones_kept"),
            now["clones_kept"],
            "onnxruntime merged or fused clones away",
        ),
        _at_least_check(
            "barriers_kept",
            "barriers kept by onnxruntime",
            b.get("barriers_kept"),
            now["barriers_kept"],
            "onnxruntime removed barriers: clones may run in the forward pass",
        ),
    ]
    if b.get("clones_late"):
        ok = now["clones_late"] is True
        checks.append(
            Check(
                "clones_late",
                "clones ran in backward",
                True,
                now["clones_late"],
                "== baseline",
                PASS if ok else FAIL,
                True,
                "",
                message="" if ok else "clones ran before the backward pass reached them",
            )
        )
    else:
        checks.append(
            Check(
                "clones_late",
                "clones ran in backward",
                b.get("clones_late"),
                now["clones_late"],
                "shown",
                INFO,
                False,
                "",
            )
        )
    checks.append(
        _increase_check(
            "step_time_ratio",
            "step time ratio",
            b.get("step_time_ratio"),
            now["step_time_ratio"],
            max_time_increase,
            "ratio",
            gated=check_time,
        )
    )
    for key, what in (
        ("original_step_time_s", "step time, original"),
        ("rewritten_step_time_s", "step time, rewritten"),
    ):
        checks.append(Check(key.removesuffix("_s"), what, b.get(key), now[key], "shown", INFO, False, "seconds"))
    for key, what in (
        ("original_live_peak_bytes", "live peak, original"),
        ("rewritten_live_peak_bytes", "live peak, rewritten"),
    ):
        if now.get(key) is not None:
            checks.append(Check(key.removesuffix("_bytes"), what, b.get(key), now[key], "shown", INFO, False, "bytes"))
    return checks


def diagnose(checks: list[Check], comparison, versions: dict) -> list[str]:
    """One line per thing the failures point at."""
    failed = {c.name for c in checks if c.status == FAIL}
    out: list[str] = []
    if "gradients" in failed and comparison is not None:
        diffs = [d for d in comparison.max_abs_diff.values() if d is not None]
        n = len(comparison.mismatched) + len(comparison.only_in_a) + len(comparison.only_in_b)
        worst = f", largest difference {max(diffs):.3g}" if diffs else ""
        shown = ", ".join((comparison.mismatched + comparison.only_in_a + comparison.only_in_b)[:3])
        out.append(
            f"the rewrite computes different results: {n} of {len(comparison.max_abs_diff)} outputs differ "
            f"({shown}{' ...' if n > 3 else ''}){worst}"
        )
    orig, rew = "original_planned_peak" in failed, "rewritten_planned_peak" in failed
    if orig and rew:
        out.append(
            "the original graph's planned peak rose too: the model changed (or onnxruntime's planner), "
            "not the rewrite; if intended, record a new baseline with --update-baseline"
        )
    elif orig:
        out.append(
            "the original graph's planned peak rose but the rewritten graph's did not: the model changed "
            "in a part the rewrite recomputes; if intended, record a new baseline"
        )
    elif rew:
        out.append(
            "only the rewritten graph's planned peak rose: the rewrite lost effect (an onnx-remat or "
            "onnxruntime change); see the clone counts"
        )
    if failed & {"segments", "clones", "barriers"}:
        out.append(
            "the rewrite is not the one recorded (segments, clones or barriers changed): the model, the "
            "selection or onnx-remat changed"
        )
    if failed & {"clones_kept", "barriers_kept", "clones_late"}:
        out.append("onnxruntime treats the recompute nodes differently (merged, fused or scheduled early)")
    if "step_time_ratio" in failed:
        out.append(
            "recompute costs more time than recorded (timing is noisy on shared machines: rerun before believing it)"
        )
    for key in ("onnxruntime", "onnx_remat"):
        was, now = versions.get(f"baseline_{key}"), versions.get(key)
        if failed and was and now and was != now:
            out.append(f"the baseline was recorded with {key.replace('_', '-')} {was}, this run uses {now}")
    return out


# -- the check -----------------------------------------------------------------------------------


def _validate_threshold(name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{name} must be a number (a fraction, e.g. 0.02), got {value!r}") from None
    if not math.isfinite(v) or v < 0:
        raise UsageError(f"{name} must be a finite fraction >= 0 (0.02 is 2%), got {value!r}")
    return v


def _same_selection(recorded: dict, wanted: dict) -> bool:
    return (
        list(recorded.get("scopes") or []) == wanted["scopes"]
        and list(recorded.get("op_types") or []) == wanted["op_types"]
        and list(recorded.get("nodes") or []) == wanted["nodes"]
        and bool(recorded.get("recompute_outputs")) == wanted["recompute_outputs"]
    )


def _describe(sel: dict) -> str:
    parts = [f"--scope {s}" for s in sel.get("scopes") or []] + [f"--op-type {o}" for o in sel.get("op_types") or []]
    parts += [f"--node {n}" for n in sel.get("nodes") or []]
    if sel.get("recompute_outputs"):
        parts.append("--recompute-outputs")
    return " ".join(parts) or "no selection"


def _runtime_version() -> str | None:
    from onnx_remat.runtime.cuda import installed_runtime

    found = installed_runtime()
    return found[1] if found else None


def check(
    model,
    *,
    baseline: str | os.PathLike,
    scopes: str | Iterable[str] | None = None,
    op_types: str | Iterable[str] | None = None,
    nodes: str | Iterable[str] | None = None,
    recompute_outputs: bool = False,
    max_peak_increase: float = 0.02,
    max_time_increase: float = 0.25,
    check_time: bool = False,
    update: bool = False,
    device: str = "cpu",
    steps: int | None = None,
    warmup: int = 1,
    seed: int = 0,
    dims: Mapping[str, int] | None = None,
    inputs: str | os.PathLike | Mapping[str, np.ndarray] | None = None,
    int_ranges: Mapping[str, tuple[int, int]] | None = None,
    checkpoint: str | os.PathLike | None = None,
    atol: float = 0.0,
    rtol: float = 0.0,
    live: bool = False,
    progress=None,
    apply_fn: Callable[..., Any] | None = None,
) -> Verdict:
    """Rewrite ``model``, measure original and rewrite, compare with the baseline; see the module docstring.

    ``model``: training graph file or artifacts directory. ``scopes``/``op_types``/
    ``recompute_outputs`` as for :func:`onnx_remat.remat.apply`; when none is given the baseline's
    selection is used. Thresholds are fractions (0.02 = 2%). ``steps`` defaults to 1 (5 with
    ``check_time``). ``update`` writes the baseline from this run (not when gradients differ);
    the checks against the old baseline, if any, are still shown but do not fail the verdict.
    ``apply_fn`` replaces :func:`onnx_remat.remat.apply` (same keyword arguments, returns an
    ``ApplyResult``): a hook for tests that inject a faulty rewrite.
    """
    from onnx_remat.runtime.compare import compare

    started = time.perf_counter()
    max_peak_increase = _validate_threshold("max_peak_increase", max_peak_increase)
    max_time_increase = _validate_threshold("max_time_increase", max_time_increase)
    if steps is None:
        steps = 5 if check_time else 1
    if steps < 1 or warmup < 1:
        raise UsageError(f"steps and warmup must be at least 1, got steps={steps}, warmup={warmup}")
    if device == "cuda":  # before anything slow: exit status 3 without a GPU or the CUDA build
        from onnx_remat.runtime.cuda import check_cuda_ready

        check_cuda_ready()
    baseline_path = Path(baseline)
    if update:  # before anything slow: a baseline that cannot be written, or is an input, fails now
        check_output(baseline_path, force=True, option="--baseline", parents=True)
        make_parents(baseline_path)
    recorded = _recorded_baseline(baseline_path, update)
    selection, recorded = _selection_to_check(
        _selection(scopes, op_types, nodes, recompute_outputs), recorded, baseline_path, device, update
    )

    apply_fn = apply_fn or _default_apply()
    result = apply_fn(
        model,
        scopes=selection["scopes"],
        op_types=selection["op_types"],
        nodes=selection["nodes"],
        recompute_outputs=selection["recompute_outputs"],
        dims=dict(dims or {}),
    )
    comparison = compare(
        model,
        result.model,
        device=device,
        atol=atol,
        rtol=rtol,
        steps=steps,
        warmup=warmup,
        dims=dims,
        inputs=inputs,
        seed=seed,
        int_ranges=int_ranges,
        checkpoint=checkpoint,
        live=live,
        progress=progress,
    )
    figures = figures_of(comparison, result)
    base_figures = recorded.get("figures") if recorded else None
    tolerance = "bit-identical" if atol == 0 and rtol == 0 else f"atol={atol:g}, rtol={rtol:g}"
    checks = build_checks(
        figures,
        base_figures,
        max_peak_increase=max_peak_increase,
        max_time_increase=max_time_increase,
        check_time=check_time,
        tolerance=tolerance,
    )
    versions = {
        "onnx_remat": __version__,
        "onnxruntime": comparison.b.onnxruntime or _runtime_version(),
        "baseline_onnx_remat": recorded.get("onnx_remat") if recorded else None,
        "baseline_onnxruntime": recorded.get("onnxruntime") if recorded else None,
    }
    diagnosis = diagnose(checks, comparison, versions)
    updated = False
    if update:
        diagnosis = [d for d in diagnosis if d.startswith("the rewrite computes different results")]
        for c in checks:  # what changed against the old baseline is accepted, not failed
            if c.status == FAIL and c.name != "gradients":
                c.status, c.message = INFO, f"{c.message + '; ' if c.message else ''}accepted by --update-baseline"
        passed = comparison.equal
        if passed:
            settings = {"seed": seed, "dims": dict(dims or {}), "atol": atol, "rtol": rtol}
            write_baseline(baseline_path, _baseline_record(model, device, selection, settings, figures, versions))
            updated = True
        else:
            diagnosis.append("baseline not written: the rewrite's gradients do not match the original's")
    else:
        passed = not any(c.status == FAIL for c in checks)
    return Verdict(
        passed=passed,
        model=str(model),
        baseline_path=baseline_path,
        selection=selection,
        device=device,
        seed=seed,
        steps=steps,
        warmup=warmup,
        thresholds={
            "max_peak_increase": max_peak_increase,
            "max_time_increase": max_time_increase,
            "check_time": check_time,
            "atol": atol,
            "rtol": rtol,
        },
        checks=checks,
        figures=figures,
        baseline_figures=base_figures,
        baseline_updated=updated,
        diagnosis=diagnosis,
        versions=versions,
        comparison=comparison,
        duration_s=time.perf_counter() - started,
    )


def _recorded_baseline(path: Path, update: bool) -> dict | None:
    """The baseline to compare with: required unless ``update``; an unreadable one is then replaced."""
    if not update:
        return read_baseline(path)
    if not path.exists():
        return None
    try:
        return read_baseline(path)
    except UsageError:
        return None


def _selection_to_check(
    selection: dict, recorded: dict | None, path: Path, device: str, update: bool
) -> tuple[dict, dict | None]:
    """The selection this run checks (the given one, else the baseline's) and the baseline still to
    compare with. A baseline for another selection or device is an error, or with ``update``,
    dropped (it is being re-recorded)."""
    if not (selection["scopes"] or selection["op_types"] or selection["nodes"]):
        if recorded is None:
            raise UsageError("give the selection to record (--scope PATTERN, --op-type OPS or --node NAME)")
        rec = recorded.get("selection") or {}
        selection = _selection(
            rec.get("scopes"),
            rec.get("op_types"),
            rec.get("nodes") or [],
            rec.get("recompute_outputs") or selection["recompute_outputs"],
        )
    if recorded is None:
        return selection, None
    same = _same_selection(recorded.get("selection") or {}, selection)
    same_device = recorded.get("device", "cpu") == device
    if update:
        return selection, recorded if same and same_device else None
    if not same:
        raise UsageError(
            f"{path} was recorded for {_describe(recorded.get('selection') or {})}, this run asks for "
            f"{_describe(selection)}: use the baseline's selection, or record a new one with --update-baseline"
        )
    if not same_device:
        raise UsageError(f"{path} was recorded on {recorded.get('device')}, this run is on {device}")
    return selection, recorded


def _baseline_record(model, device: str, selection: dict, settings: dict, figures: dict, versions: dict) -> dict:
    """The baseline file's content (schema in the module docstring)."""
    return {
        "schema": BASELINE_SCHEMA,
        "recorded": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "onnx_remat": __version__,
        "onnxruntime": versions["onnxruntime"],
        "model": str(model),
        "device": device,
        "selection": selection,
        "settings": settings,
        "figures": figures,
    }


def _default_apply():
    from onnx_remat.remat.apply import apply

    return apply
