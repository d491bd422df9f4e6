"""onnx-remat against PyTorch activation checkpointing: one run, one machine, the same networks.

    python -m benchmarks.compare_pytorch                         # every model in models/
    python -m benchmarks.compare_pytorch --models blocks10 gpt --steps 5
    python -m benchmarks.compare_pytorch --artifacts path/to/artifacts --scope 'encoder.layer.*'
    python -m benchmarks.compare_pytorch --device cuda --out benchmarks/results

For each model of ``models.MODELS`` (``--models``: some of them) it measures, each configuration
in a fresh process:

* onnxruntime-training 1.19.2 on the model's committed artifacts (``models/artifacts/<name>``):
  ``baseline`` (no recompute), ``onnx-remat`` (``onnx_remat.apply(scopes=block_scope)``: every
  repeated block recomputed), ``onnx-remat + outputs`` (the same with
  ``recompute_outputs=True``: block outputs that feed the next block are not stored either) and
  ``onnx-remat, --dropout seed`` (per block, no dropout mask stored: another random stream, so
  checked against the baseline given the same seeds instead of bit for bit).
  Figures from :func:`onnx_remat.runtime.measure.measure`: the planned peak (the memory-pattern
  block of a step), the live peak (RSS growth of a step, no arena; CPU) and the median step time.
  Each rewrite is also checked against the baseline with
  :func:`onnx_remat.runtime.compare.compare` (loss and every gradient, bit for bit).
* PyTorch eager on the same module (``ModelSpec.build()``: the parameters the artifacts were
  exported from), the same example inputs, target and loss (:mod:`benchmarks.torch_step`):
  ``eager`` and ``checkpoint`` (``torch.utils.checkpoint.checkpoint(block.forward, ...,
  use_reentrant=False)`` around every block of ``ModelSpec.blocks``). The live peak by the same
  method as onnxruntime's (:class:`onnx_remat.runtime.memory.RssPeak`, glibc's mmap threshold
  set so freed buffers go back at once, after a warm-up step, ``torch.set_num_threads(2)``); on
  CUDA ``torch.cuda.max_memory_allocated``. Step times from a second process with the normal
  allocator (as onnxruntime's come from its arena process, not the live one).

onnxruntime gets PyTorch's example inputs (``inputs=`` of measure), so both run the same data.

Ratios are to each runtime's own baseline (onnx-remat / onnxruntime baseline, checkpoint /
eager). To explain a gap between onnx-remat's and PyTorch's peak ratio, the run also sums what
each keeps stored for its recompute: onnx-remat, what its recomputed segments keep from the
forward pass (block inputs, outputs read outside the block, dropout masks); PyTorch, the inputs
of the checkpointed blocks. onnxruntime's Dropout draws from a global generator that cannot be
replayed, so a bit-identical recompute keeps each mask (onnx-remat's default: packed to one bit
per element) and replays the output from it; PyTorch saves the RNG state instead and draws the
same mask again. The onnx-remat rows use ``apply``'s defaults (``dropout="packed"``).

``--artifacts DIR`` adds an artifacts directory (or training graph) of your own: onnxruntime rows
only, with synthesized inputs, scope from ``--scope`` (default: the block scope of the model of
the same name, if any).

Step times: every configuration runs ``--rounds`` times (default 3) in fresh processes, the
configurations taking turns, so that a busy spell of a shared machine falls on all of them; the
first round also measures the peaks. The median is over all timed steps of all rounds.

To explain a gap, the run also reports what fills onnx-remat's planned peak, from
:mod:`onnx_remat.estimate` (a simulation of onnxruntime's planner): the buffers alive at the peak
by where their tensor came from (stored from the forward pass, masks among them; the clones; the
backward pass), and how much of it is held for reuse (buffers whose tensor's readers have all run,
kept because onnxruntime's reuse plan gives them to a later tensor of the same shape).

Writes ``<out>/<device>.md`` (Markdown tables) and ``<out>/<device>.json``::

    {
      "date": "2025-01-01T12:00:00+00:00", "command": "...", "steps": 5, "warmup": 1, "rounds": 3,
      "device": "cpu", "duration_s": 600.0,
      "machine": {"cpu": "...", "cores": 2, "memory_bytes": ..., "python": "3.11.9", "platform": "...",
                  "torch": "2.13.0", "onnxruntime": "1.19.2", "onnx": "...", "onnx_remat": "0.1.0",
                  "git_head": "...", "loadavg_start": [1m, 5m, 15m], "loadavg_end": [...]},
      "models": [
        {"name": "blocks10", "scope": "Block", "source": "models" | "artifacts",
         "rows": [{"runtime": "onnxruntime" | "pytorch", "config": "baseline" | "remat" |
                   "remat_outputs" | "remat_seed" | "budget:<SIZE>" | "eager" | "checkpoint", "label": "...",
                   "planned_peak_bytes": int|null, "arena_peak_bytes": int|null,   # onnxruntime only
                   "live_peak_bytes": int|null, "live_peak_samples": [...],
                   "step_time_s": {"median", "min", "max", "samples", "round_medians"},
                   "peak_ratio": float|null,          # live peak / own baseline's (CUDA: arena /
                                                      # max_memory_allocated)
                   "planned_peak_ratio": float|null,  # onnxruntime only
                   "time_ratio": float|null,          # median step time / own baseline's
                   "gradients_identical": bool|null,  # onnx-remat rows: vs the baseline, bit for bit
                   "seed_check": bool|null,           # remat_seed (dropout="seed"; another random stream):
                                                      # equal to the baseline with the same seeds, and
                                                      # the recomputed masks to the forward ones
                   "loss": float|null, "clones": int|null, "clones_kept": int|null,
                   "segments": int|null, "loadavg": [...], "wall_s": float, "error": str|null}, ...],
         "stored": {"onnx_remat": {"dropout_masks": n, "dropout_mask_bytes": int, "other_bytes": int,
                                   "total_bytes": int, "unknown_sizes": n},
                    "pytorch_checkpoint": {"block_input_bytes": int} | null},
         "peak_breakdown": {"estimated_peak_bytes", "peak_node", "stored_bytes", "stored_mask_bytes",
                            "recompute_bytes", "backward_bytes", "held_bytes"} | null,
         "verdict": {"peak": "better" | "on par" | "short" | null, "time": ...,
                     "reason": "one phrase", "why": "the figures behind it"}}
      ],
      "notes": ["..."]
    }

About 10-15 minutes for all five models with the defaults on 2 cores. Peaks are the same run to
run (within ~1%); step times on a shared machine are not: the load average before each
configuration is in the JSON.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from onnx_remat.model_io import write_file

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_OUT = ROOT / "benchmarks" / "results"
PEAK_TOLERANCE = 0.02  # ratios this close count as "on par"
TIME_TOLERANCE = 0.05

ORT_CONFIGS = (
    ("baseline", "onnxruntime, no recompute"),
    ("remat", "onnx-remat per block"),
    ("remat_outputs", "onnx-remat per block + recompute outputs"),
    ("remat_seed", "onnx-remat per block, --dropout seed"),
)
TORCH_CONFIGS = (
    ("eager", "PyTorch eager"),
    ("checkpoint", "PyTorch checkpoint per block"),
)
MiB = 2**20


# -- rows ----------------------------------------------------------------------------------------


@dataclass
class Row:
    """One measured configuration of one model."""

    runtime: str
    config: str
    label: str
    planned_peak_bytes: int | None = None
    arena_peak_bytes: int | None = None
    live_peak_bytes: int | None = None
    live_peak_samples: list = field(default_factory=list)
    step_time_s: dict = field(default_factory=dict)
    peak_ratio: float | None = None
    planned_peak_ratio: float | None = None
    time_ratio: float | None = None
    gradients_identical: bool | None = None
    seed_check: bool | None = None  # remat_seed: equal to the baseline with the same seeds, masks redrawn alike
    loss: float | None = None
    clones: int | None = None
    clones_kept: int | None = None
    segments: int | None = None
    loadavg: list = field(default_factory=list)
    wall_s: float | None = None
    error: str | None = None

    @property
    def median(self) -> float | None:
        return self.step_time_s.get("median") if self.step_time_s else None

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _ratio(b, a):
    return None if a in (None, 0) or b is None else b / a


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- what onnx-remat keeps stored ----------------------------------------------------------------


def _is_mask(t) -> bool:
    p = t.inputs[0] if getattr(t, "inputs", None) else None
    return p is not None and p.op == "Dropout" and len(p.outputs) > 1 and p.outputs[1] is t


def stored_for_recompute(result) -> dict:
    """What the recomputed segments of a rewrite (an ApplyResult) keep stored from the forward pass.

    Per segment of the plan: its boundary (the tensors its clones recompute from: block inputs)
    and what it keeps (outputs read outside it, random ops' outputs: dropout masks); for a
    training-mode Dropout the rewrite replays, its mask as stored (packed: one bit per element).
    Counted once each; parameters and constants left out. Split into dropout masks and the rest.
    """
    import onnx_graphsurgeon as gs

    from onnx_remat.runtime.inputs import classify_inputs

    params = {p.name for p in classify_inputs(result.model).parameters}
    sizes = result.analysis.sizes
    masks: dict[str, int | None] = {}
    other: dict[str, int | None] = {}
    for seg in result.plan.segments:
        # Bytes stored per replayed mask: one per element, one bit (packed, the default) or none (seed).
        masks.update(seg.mask_storage)
        masks.update({t.name: None for t in seg.masks if t.name not in seg.mask_storage})
        for t in list(seg.boundary) + list(seg.kept):
            if isinstance(t, gs.Constant) or not t.name or t.name in params:
                continue
            (masks if _is_mask(t) else other)[t.name] = sizes.nbytes(t.name)
    other = {k: v for k, v in other.items() if k not in masks}
    known = lambda d: sum(v for v in d.values() if v is not None)
    return {
        "dropout_masks": len(masks),
        "dropout_mask_bytes": known(masks),
        "other_bytes": known(other),
        "total_bytes": known(masks) + known(other),
        "unknown_sizes": sum(v is None for v in [*masks.values(), *other.values()]),
    }


def peak_breakdown(source, scope: str) -> dict | None:
    """What fills onnx-remat's planned peak, from :mod:`onnx_remat.estimate` (a simulation of
    onnxruntime's planner, exact to the byte for most rewrites of the example models).

    ``{"estimated_peak_bytes", "peak_node", "stored_bytes", "stored_mask_bytes",
    "recompute_bytes", "backward_bytes", "held_bytes"}``: buffers alive at the peak, by where
    their tensor was made (stored from the forward pass, split into dropout masks and the rest;
    made by the clones; made by the backward pass); ``held_bytes``: those of them whose tensor's
    readers have all run before the peak (the buffer is kept for a later tensor of the same shape
    that reuses it: onnxruntime's reuse plan). None when the estimator is not available or fails.
    """
    try:
        import onnx_remat
        from onnx_remat.estimate import estimate
        from onnx_remat.graph import tags
    except ImportError:
        return None
    try:
        est = estimate(source, scopes=[scope], scope_table=False)
        rewritten = onnx_remat.apply(source, scopes=scope).model
    except Exception:
        return None
    after = est.after
    if after is None:
        return None
    position = {step.node: i for i, step in enumerate(after.steps)}
    readers: dict[str, list[str]] = {}
    masks = set()
    for node in rewritten.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node.name)
        if node.op_type == "Dropout" and len(node.output) > 1:
            masks.add(node.output[1])
        if tags.is_pack_name(node.name):  # a mask packed to bits (its buffers: the packed bytes)
            masks.update(node.output)
    out = {
        "estimated_peak_bytes": after.planned_peak_bytes,
        "peak_node": after.peak_node,
        "stored_bytes": 0,
        "stored_mask_bytes": 0,
        "recompute_bytes": 0,
        "backward_bytes": 0,
        "held_bytes": 0,
    }
    for t in after.live_at_peak:
        if t.region == "forward":
            out["stored_bytes"] += t.bytes
            if t.tensor in masks:
                out["stored_mask_bytes"] += t.bytes
        elif t.region == "recompute":
            out["recompute_bytes"] += t.bytes
        else:
            out["backward_bytes"] += t.bytes
        positions = [position.get(r) for r in readers.get(t.tensor, [])]
        if positions and all(p is not None and p < after.peak_step for p in positions):
            out["held_bytes"] += t.bytes
    return out


# -- onnxruntime rows ----------------------------------------------------------------------------


@dataclass
class _Config:
    """One configuration to measure: how to run it once with live peak, and once more for time."""

    row: Row
    model: object = None  # onnxruntime: path or ModelProto
    checkpoint: object = None
    name: str | None = None  # pytorch: model name
    samples: list = field(default_factory=list)
    round_medians: list = field(default_factory=list)


def _budget_configs(budgets: list[str] | None) -> list[tuple[str, str]]:
    """``--budget`` rows: ``budget:<SIZE>`` (``floor``: the lowest peak the planner reaches)."""
    return [(f"budget:{b}", f"onnx-remat --budget {b}") for b in budgets or []]


def _apply_budget(source, budget: str):
    """``onnx_remat.apply(source, budget=...)``; ``floor``: the planner's lowest estimated peak."""
    import onnx_remat
    from onnx_remat.remat.budget import BudgetPlanner

    if budget == "floor":
        return onnx_remat.apply(source, budget=BudgetPlanner(onnx_remat.analyze_model(source)).floor().peak)
    return onnx_remat.apply(source, budget=budget)


def _ort_configs(
    source, scope: str, *, inputs, steps: int, warmup: int, device: str, budgets: list[str] | None = None
) -> tuple[list[_Config], dict | None]:
    """Rewrite, measure (planned + live peak, time) and check the gradients of each onnxruntime configuration."""
    import onnx_remat
    from onnx_remat.model_io import load_model
    from onnx_remat.runtime.compare import compare
    from onnx_remat.runtime.measure import measure

    loaded = load_model(source, check=False)
    checkpoint = loaded.checkpoint_path
    stored = None
    configs: list[_Config] = []
    for config, label in [*ORT_CONFIGS, *_budget_configs(budgets)]:
        row = Row("onnxruntime", config, label, loadavg=_loadavg())
        cfg = _Config(row, checkpoint=checkpoint)
        t0 = time.perf_counter()
        try:
            if config == "baseline":
                cfg.model = source
            elif config.startswith("budget:"):
                result = _apply_budget(source, config.split(":", 1)[1])
                cfg.model = result.model
                row.clones = result.clone_count
                row.segments = len(result.rewrite.segments)
            else:
                result = onnx_remat.apply(
                    source,
                    scopes=scope,
                    recompute_outputs=(config == "remat_outputs"),
                    dropout="seed" if config == "remat_seed" else "packed",
                )
                cfg.model = result.model
                row.clones = result.clone_count
                row.segments = len(result.rewrite.segments)
                if config == "remat":
                    stored = stored_for_recompute(result)
            m = measure(cfg.model, device=device, steps=steps, warmup=warmup, inputs=inputs, checkpoint=checkpoint)
            row.planned_peak_bytes = m.planned_peak_bytes
            row.arena_peak_bytes = m.arena_peak_bytes
            row.live_peak_bytes = m.live_peak_bytes
            row.live_peak_samples = m.live_peak_samples
            row.loss = m.loss
            cfg.samples.extend(m.step_time_s.samples)
            cfg.round_medians.append(m.step_time_s.median)
            if config != "baseline":
                row.clones_kept = m.rewrite.clones_kept
                c = compare(
                    source,
                    cfg.model,
                    device=device,
                    steps=1,
                    warmup=1,
                    inputs=inputs,
                    checkpoint=checkpoint,
                    live=False,
                )
                # dropout=seed: not bit-identical by design; compare checks it against the baseline
                # with the same seeds, and the redrawn masks against the forward ones.
                row.gradients_identical = c.equal if c.by_design is None else None
                row.seed_check = c.equal if c.by_design is not None else None
        except Exception as exc:
            row.error = f"{type(exc).__name__}: {exc}"
        row.wall_s = round(time.perf_counter() - t0, 2)
        configs.append(cfg)
        _log(f"  {label}: {_row_line(row, cfg.samples)}")
    return configs, stored


def _ort_time(cfg: _Config, *, inputs, steps: int, warmup: int, device: str) -> None:
    from onnx_remat.runtime.measure import measure

    m = measure(
        cfg.model, device=device, steps=steps, warmup=warmup, inputs=inputs, checkpoint=cfg.checkpoint, live=False
    )
    cfg.samples.extend(m.step_time_s.samples)
    cfg.round_medians.append(m.step_time_s.median)


# -- PyTorch rows --------------------------------------------------------------------------------


def torch_worker(
    name: str, kind: str, checkpoint: bool, *, steps: int, warmup: int, device: str, threads: int = 2
) -> dict:
    """Run :mod:`benchmarks.torch_step` in a fresh process; its result dict (RuntimeError if it failed)."""
    from onnx_remat.runtime.memory import LIVE_MALLOC_ENV

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    if kind == "live" and device == "cpu":
        env.update(LIVE_MALLOC_ENV)
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.torch_step",
        "--model",
        name,
        "--kind",
        kind,
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
        "--device",
        device,
        "--threads",
        str(threads),
    ]
    if checkpoint:
        cmd.append("--checkpoint")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    for line in reversed(proc.stdout.splitlines()):
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "result" in msg:
            return msg["result"]
        if "error" in msg:
            raise RuntimeError(msg["error"])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    raise RuntimeError(f"torch worker exited with status {proc.returncode}: {tail[:300]}")


def _torch_configs(name: str, *, steps: int, warmup: int, device: str) -> tuple[list[_Config], dict]:
    configs: list[_Config] = []
    block_inputs = None
    for config, label in TORCH_CONFIGS:
        row = Row("pytorch", config, label, loadavg=_loadavg())
        cfg = _Config(row, name=name)
        t0 = time.perf_counter()
        try:
            live = torch_worker(name, "live", config == "checkpoint", steps=steps, warmup=warmup, device=device)
            row.live_peak_bytes = live["live_peak_bytes"]
            row.live_peak_samples = live["live_peak_samples"]
            if config == "checkpoint":
                block_inputs = live.get("block_input_bytes")
            _torch_time(cfg, steps=steps, warmup=warmup, device=device)
        except Exception as exc:
            row.error = f"{type(exc).__name__}: {exc}"
        row.wall_s = round(time.perf_counter() - t0, 2)
        configs.append(cfg)
        _log(f"  {label}: {_row_line(row, cfg.samples)}")
    return configs, {"block_input_bytes": block_inputs}


def _torch_time(cfg: _Config, *, steps: int, warmup: int, device: str) -> None:
    timed = torch_worker(cfg.name, "time", cfg.row.config == "checkpoint", steps=steps, warmup=warmup, device=device)
    cfg.samples.extend(timed["step_times"])
    cfg.round_medians.append(statistics.median(timed["step_times"]) if timed["step_times"] else None)
    if cfg.row.loss is None:
        cfg.row.loss = timed["loss"]


def _measure_model(
    name: str | None,
    source,
    scope: str,
    *,
    inputs,
    steps: int,
    warmup: int,
    rounds: int,
    device: str,
    torch_rows: bool,
    budgets: list[str] | None = None,
) -> tuple[list[Row], dict | None, dict]:
    """Every configuration of one model: round 1 measures everything, rounds 2.. only step times,
    the configurations taking turns so a busy spell of the machine falls on all of them."""
    from onnx_remat.runtime.measure import StepTimes

    ort, stored = _ort_configs(source, scope, inputs=inputs, steps=steps, warmup=warmup, device=device, budgets=budgets)
    pt, pt_stored = _torch_configs(name, steps=steps, warmup=warmup, device=device) if torch_rows and name else ([], {})
    for k in range(2, rounds + 1):
        for cfg in ort + pt:
            if cfg.row.error:
                continue
            try:
                if cfg.row.runtime == "onnxruntime":
                    _ort_time(cfg, inputs=inputs, steps=steps, warmup=warmup, device=device)
                else:
                    _torch_time(cfg, steps=steps, warmup=warmup, device=device)
            except Exception as exc:
                cfg.row.error = f"round {k}: {type(exc).__name__}: {exc}"
        _log(
            f"  round {k}/{rounds}: "
            + ", ".join(
                f"{c.row.config} {_seconds(c.round_medians[-1] if c.round_medians else None)}" for c in ort + pt
            )
        )
    for group in (ort, pt):
        if not group:
            continue
        for cfg in group:
            cfg.row.step_time_s = {**StepTimes.of(cfg.samples).to_json(), "round_medians": cfg.round_medians}
        base = group[0].row
        for cfg in group:
            row = cfg.row
            if device == "cpu" or row.runtime == "pytorch":
                row.peak_ratio = _ratio(row.live_peak_bytes, base.live_peak_bytes)
            else:
                row.peak_ratio = _ratio(row.arena_peak_bytes, base.arena_peak_bytes)
            row.planned_peak_ratio = _ratio(row.planned_peak_bytes, base.planned_peak_bytes)
            row.time_ratio = _ratio(row.median, base.median)
    return [c.row for c in ort + pt], stored, pt_stored


# -- verdicts ------------------------------------------------------------------------------------


def _compare_ratio(ours: float | None, theirs: float | None, tol: float) -> str | None:
    if ours is None or theirs is None:
        return None
    if ours < theirs - tol:
        return "better"
    if ours > theirs + tol:
        return "short"
    return "on par"


def _mib(n: int | float | None) -> str:
    return "?" if n is None else f"{n / MiB:.1f} MiB"


def verdict(
    rows: dict[str, Row], stored: dict | None, torch_stored: dict | None, breakdown: dict | None = None
) -> dict:
    """onnx-remat (per block) against PyTorch checkpointing: peak and time ratios, and why.

    ``{"peak", "time"}``: ``better`` / ``on par`` / ``short`` (ratios within 0.02 / 0.05 are on
    par); ``reason``: one phrase for the table; ``why``: the figures behind it.
    """
    ours, theirs = rows.get("remat"), rows.get("checkpoint")
    if ours is None or theirs is None:
        return {"peak": None, "time": None, "reason": "", "why": ""}
    peak = _compare_ratio(ours.peak_ratio, theirs.peak_ratio, PEAK_TOLERANCE)
    speed = _compare_ratio(ours.time_ratio, theirs.time_ratio, TIME_TOLERANCE)
    base_ort, base_pt = rows.get("baseline"), rows.get("eager")
    a, b = ours.live_peak_bytes, theirs.live_peak_bytes
    masks = (stored or {}).get("dropout_mask_bytes") or 0
    n_masks = (stored or {}).get("dropout_masks") or 0
    inputs_pt = (torch_stored or {}).get("block_input_bytes")
    why: list[str] = []
    reason = ""
    if a is not None and b is not None:
        why.append(
            f"live peak onnx-remat {_mib(a)} vs PyTorch checkpoint {_mib(b)}"
            + (
                f" (baselines {_mib(base_ort.live_peak_bytes)} vs {_mib(base_pt.live_peak_bytes)})"
                if base_ort and base_pt and base_ort.live_peak_bytes and base_pt.live_peak_bytes
                else ""
            )
        )
    if stored is not None:
        what = (
            f"{n_masks} dropout masks ({_mib(masks)}) and {_mib(stored['other_bytes'])} of block inputs and outputs"
            if n_masks
            else f"{_mib(stored['other_bytes'])} of block inputs and outputs (no dropout masks)"
        )
        why.append(
            f"onnx-remat keeps {_mib(stored['total_bytes'])} stored for its recompute: {what}"
            + (f"; PyTorch keeps {_mib(inputs_pt)} of block inputs" if inputs_pt is not None else "")
            + (" and re-draws the masks from the saved RNG state" if inputs_pt is not None and n_masks else "")
        )
    if breakdown is not None:
        work = breakdown["recompute_bytes"] + breakdown["backward_bytes"]
        line = (
            f"at onnx-remat's planned peak (simulated: {_mib(breakdown['estimated_peak_bytes'])}): "
            f"{_mib(breakdown['stored_bytes'])} stored from the forward pass "
            f"({_mib(breakdown['stored_mask_bytes'])} of it masks), {_mib(work)} made by the recompute and "
            "backward of the block being processed"
        )
        if breakdown.get("held_bytes"):
            line += (
                f", {_mib(breakdown['held_bytes'])} of all that in buffers whose tensor's readers have all run "
                "(kept for a later tensor of the same shape: onnxruntime's buffer reuse)"
            )
        if b is not None and inputs_pt is not None:
            line += f"; PyTorch's peak minus its stored block inputs: {_mib(b - inputs_pt)}"
        why.append(line)
    if peak == "short" and a is not None and b is not None:
        gap = a - b
        if a <= b * (1 + PEAK_TOLERANCE):
            reason = (
                f"absolute peak on par or lower ({_mib(a)} vs {_mib(b)}); the ratio is higher because "
                "onnxruntime's own baseline is leaner"
            )
        elif masks and masks >= gap:
            reason = (
                f"{n_masks} dropout masks kept for a bit-identical replay ({_mib(masks)}) cover the {_mib(gap)} gap"
            )
        elif breakdown is not None and inputs_pt is not None:
            work = breakdown["recompute_bytes"] + breakdown["backward_bytes"]
            held = breakdown.get("held_bytes") or 0
            reason = (
                f"larger working set at the peak ({_mib(work)} vs at most {_mib(b - inputs_pt)} in PyTorch"
                + (f"; {_mib(held)} of onnx-remat's peak are buffers held for reuse" if held else "")
                + ")"
                + (f", plus {n_masks} dropout masks ({_mib(masks)})" if masks else "")
            )
        else:
            reason = (
                f"{n_masks} dropout masks ({_mib(masks)}) explain part of the {_mib(gap)} gap"
                if masks
                else f"{_mib(gap)} gap not explained by stored tensors"
            )
    elif peak == "better":
        reason = "lower peak ratio" + (f" despite {n_masks} dropout masks kept ({_mib(masks)})" if masks else "")
    elif peak == "on par":
        reason = "same peak ratio" + (f" despite {n_masks} dropout masks kept ({_mib(masks)})" if masks else "")
    return {"peak": peak, "time": speed, "reason": reason, "why": "; ".join(why)}


# -- machine and output --------------------------------------------------------------------------


def machine_info() -> dict:
    """CPU model, cores, memory, versions."""
    import importlib.metadata as md

    cpu = platform.processor() or None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass

    def version(*names):
        for n in names:
            try:
                return md.version(n)
            except md.PackageNotFoundError:
                continue
        return None

    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        head = ""
    import onnx_remat

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_bytes": mem,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": version("torch"),
        "onnxruntime": version("onnxruntime-training-cpu", "onnxruntime-training", "onnxruntime"),
        "onnx": version("onnx"),
        "onnx_remat": onnx_remat.__version__,
        "git_head": head or None,
    }


def _seconds(t: float | None) -> str:
    return "?" if t is None else (f"{t * 1000:.0f} ms" if t < 1 else f"{t:.2f} s")


def _x(r: float | None) -> str:
    return "?" if r is None else f"x{r:.2f}"


def _row_line(row: Row, samples: list | None = None) -> str:
    if row.error:
        return f"error: {row.error}"
    median = statistics.median(samples) if samples else row.median
    planned = f"planned {_mib(row.planned_peak_bytes)}, " if row.runtime == "onnxruntime" else ""
    return f"{planned}live {_mib(row.live_peak_bytes)}, step {_seconds(median)} ({row.wall_s or 0:.0f} s)"


def to_markdown(report: dict) -> str:
    """The results as Markdown: the summary (onnx-remat beside PyTorch), then every configuration."""
    m = report["machine"]
    rounds = report.get("rounds", 1)
    lines = [
        f"# onnx-remat vs PyTorch checkpointing ({report['device']})",
        "",
        f"{report['date']}; {m['cpu']}, {m['cores']} cores; torch {m['torch']}, "
        f"onnxruntime-training {m['onnxruntime']}, "
        f"onnx-remat {m['onnx_remat']} (git {m['git_head']}). Each configuration in fresh processes: peaks after "
        f"{report['warmup']} warm-up step; step times: {report['steps']} timed steps x {rounds} round"
        f"{'s' if rounds != 1 else ''} (configurations taking turns), median of all. Load average "
        f"{m.get('loadavg_start')} at the start, {m.get('loadavg_end')} at the end"
        + (
            " (a shared machine: step times are noisy, peaks are not)."
            if (m.get("loadavg_end") or [0])[0] > 0.5 * (m.get("cores") or 1)
            else "."
        ),
        "",
        f"Command: `{report['command']}`",
        "",
        "Peak ratio: live peak (RSS growth of one training step, no arena, after a warm-up step; the same "
        "measurement for both runtimes) over the same runtime's baseline; onnxruntime's planned peak ratio (its "
        "memory planner's activation block, deterministic) in brackets. Time ratio: median step time over the "
        "baseline's. A step is forward + loss + backward into existing gradient buffers (what onnxruntime's "
        "training graph runs; no optimizer update), with the same module, parameters, inputs and loss in both "
        "runtimes. PyTorch checkpoint: `torch.utils.checkpoint.checkpoint(block.forward, ..., use_reentrant=False)` "
        "around every repeated block; onnx-remat: `onnx_remat.apply(scopes=<block scope>)`.",
        "",
        "## Summary: onnx-remat per block beside PyTorch checkpoint per block",
        "",
        "| model | onnx-remat peak ratio | onnx-remat time ratio | PyTorch checkpoint peak ratio "
        "| PyTorch time ratio | live peak, onnx-remat / PyTorch | peak vs PyTorch | time vs PyTorch | why |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for model in report["models"]:
        rows = {r["config"]: r for r in model["rows"]}
        ours, theirs = rows.get("remat"), rows.get("checkpoint")
        if ours is None:
            continue
        v = model.get("verdict") or {}
        absolute = (
            f"{_mib(ours.get('live_peak_bytes'))} / {_mib(theirs.get('live_peak_bytes'))}"
            if theirs
            else _mib(ours.get("live_peak_bytes"))
        )
        lines.append(
            f"| {model['name']} | {_x(ours.get('peak_ratio'))} [{_x(ours.get('planned_peak_ratio'))}] "
            f"| {_x(ours.get('time_ratio'))} "
            f"| {_x(theirs.get('peak_ratio')) if theirs else '-'} | {_x(theirs.get('time_ratio')) if theirs else '-'} "
            f"| {absolute} | {v.get('peak') or '-'} | {v.get('time') or '-'} | {v.get('reason') or ''} |"
        )
    whys = [(model["name"], (model.get("verdict") or {}).get("why")) for model in report["models"]]
    if any(w for _, w in whys):
        lines += ["", "Figures behind the last column:", ""]
        lines += [f"- **{name}**: {w}." for name, w in whys if w]
    lines += [
        "",
        "## Every configuration",
        "",
        "| model | runtime | configuration | planned peak | live peak | peak ratio | step time (median) | time ratio "
        "| gradients bit-identical | clones kept |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model in report["models"]:
        for r in model["rows"]:
            if r.get("error"):
                lines.append(f"| {model['name']} | {r['runtime']} | {r['label']} | error: {r['error']} | | | | | | |")
                continue
            grads = {True: "yes", False: "**NO**", None: "-"}[r.get("gradients_identical")]
            if r.get("seed_check") is not None:
                same = "equal with the same seeds" if r["seed_check"] else "**seed check failed**"
                grads = f"not by design; {same}"
            kept = f"{r['clones_kept']}/{r['clones']}" if r.get("clones") is not None else "-"
            planned = _mib(r.get("planned_peak_bytes")) if r["runtime"] == "onnxruntime" else "-"
            pr = _x(r.get("peak_ratio")) + (
                f" [{_x(r.get('planned_peak_ratio'))}]" if r["runtime"] == "onnxruntime" else ""
            )
            st = r.get("step_time_s") or {}
            lines.append(
                f"| {model['name']} | {r['runtime']} | {r['label']} | {planned} | {_mib(r.get('live_peak_bytes'))} "
                f"| {pr} | {_seconds(st.get('median'))} | {_x(r.get('time_ratio'))} | {grads} | {kept} |"
            )
    lines += [
        "",
        "## What each keeps stored for its recompute, and what fills onnx-remat's peak",
        "",
        "onnx-remat: the tensors its recomputed blocks keep from the forward pass (their inputs, the outputs read "
        "outside them, dropout masks as stored: packed to one bit per element), counted once, parameters left "
        "out. PyTorch checkpoint: the tensor inputs of "
        "the checkpointed blocks (it saves the RNG state and re-draws dropout masks). At the peak: the tensors alive "
        "when onnxruntime's planned block reaches its size, from `onnx_remat.estimate` (a simulation of "
        "onnxruntime's planner; its peak is given beside the measured one); held for reuse: buffers alive at the "
        "peak whose tensor's readers have all run, kept because onnxruntime's reuse plan gives the buffer to a later "
        "tensor of the same shape.",
        "",
        "| model | onnx-remat: dropout masks | onnx-remat: other stored | PyTorch: block inputs "
        "| at onnx-remat's peak: "
        "stored (masks) | at the peak: recompute + backward | at the peak: held for reuse | simulated / measured "
        "planned peak |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model in report["models"]:
        st = model.get("stored") or {}
        o, p = st.get("onnx_remat") or {}, st.get("pytorch_checkpoint") or {}
        if not o:
            continue
        bd = model.get("peak_breakdown") or {}
        measured = next((r.get("planned_peak_bytes") for r in model["rows"] if r["config"] == "remat"), None)
        at_peak = (
            (
                f"{_mib(bd['stored_bytes'])} ({_mib(bd['stored_mask_bytes'])})",
                _mib(bd["recompute_bytes"] + bd["backward_bytes"]),
                _mib(bd.get("held_bytes")),
                f"{_mib(bd['estimated_peak_bytes'])} / {_mib(measured)}",
            )
            if bd
            else ("-", "-", "-", "-")
        )
        lines.append(
            f"| {model['name']} | {o['dropout_masks']} = {_mib(o['dropout_mask_bytes'])} | {_mib(o['other_bytes'])} "
            f"| {_mib(p.get('block_input_bytes')) if p else '-'} | {' | '.join(at_peak)} |"
        )
    notes = report.get("notes") or []
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, text, force=True)  # results are rewritten on every run


# -- the run -------------------------------------------------------------------------------------


def _has_dropout(spec) -> bool:
    import torch

    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in spec.build().modules())


def _example_feeds(spec) -> dict:
    """PyTorch's example inputs and target as onnxruntime feeds (graph input name -> array)."""
    feeds = {name: t.numpy() for name, t in zip(spec.input_names, spec.example_inputs())}
    target = spec.example_target()
    if spec.target_name is not None and target is not None:
        feeds[spec.target_name] = target.numpy()
    return feeds


def run(
    models: list[str] | None = None,
    artifacts: list[str] | None = None,
    *,
    scope: str | None = None,
    steps: int = 5,
    warmup: int = 1,
    rounds: int = 3,
    device: str = "cpu",
    torch_rows: bool = True,
    command: str = "",
    budgets: list[str] | None = None,
) -> dict:
    """Measure and return the report (the JSON object of the module docstring)."""
    from models import ARTIFACTS_DIR_NAME, MODELS

    names = list(MODELS) if models is None else list(models)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    machine = machine_info()
    machine["loadavg_start"] = _loadavg()
    report = {
        "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "command": command,
        "steps": steps,
        "warmup": warmup,
        "rounds": rounds,
        "device": device,
        "machine": machine,
        "models": [],
        "notes": [],
    }
    jobs = [(n, ROOT / "models" / ARTIFACTS_DIR_NAME / n, MODELS[n].block_scope, "models") for n in names]
    for path in artifacts or []:
        p = Path(path)
        pattern = scope or (MODELS[p.name].block_scope if p.name in MODELS else None)
        if pattern is None:
            raise SystemExit(f"{path}: give --scope (no model of that name in models/)")
        jobs.append((None, p, pattern, "artifacts"))
    for name, source, pattern, kind in jobs:
        spec = MODELS[name] if name else None
        _log(f"{name or source} (scope {pattern})")
        rows, stored, pt_stored = _measure_model(
            name,
            source,
            pattern,
            inputs=_example_feeds(spec) if spec else None,
            steps=steps,
            warmup=warmup,
            rounds=rounds,
            device=device,
            torch_rows=torch_rows and spec is not None,
            budgets=budgets,
        )
        has_pt = any(r.runtime == "pytorch" for r in rows)
        report["models"].append(
            {
                "name": name or str(source),
                "scope": pattern,
                "source": kind,
                "rows": [r.to_json() for r in rows],
                "stored": {"onnx_remat": stored, "pytorch_checkpoint": pt_stored if has_pt else None},
                "peak_breakdown": peak_breakdown(source, pattern),
                "same_loss_expected": spec is not None and not _has_dropout(spec),
            }
        )
    machine["loadavg_end"] = _loadavg()
    return finish(report)


def finish(report: dict) -> dict:
    """Verdicts per model and the notes, from the measured figures (also used by ``--render``)."""
    report["notes"] = []
    merged = []
    for model in report["models"]:
        rows = {r["config"]: Row(**r) for r in model["rows"]}
        st = model.get("stored") or {}
        has_pt = "checkpoint" in rows
        model["verdict"] = (
            verdict(rows, st.get("onnx_remat"), st.get("pytorch_checkpoint"), model.get("peak_breakdown"))
            if has_pt
            else {"peak": None, "time": None, "reason": "onnxruntime only", "why": ""}
        )
        if "same_loss_expected" not in model:  # a results file of an earlier version
            from models import MODELS

            spec = MODELS.get(model["name"])
            model["same_loss_expected"] = spec is not None and not _has_dropout(spec)
        if model.get("same_loss_expected") and has_pt and "baseline" in rows and "eager" in rows:
            report["notes"].append(
                f"{model['name']}: no dropout, so both runtimes compute the same loss from the same parameters and "
                f"inputs: onnxruntime {rows['baseline'].loss}, PyTorch {rows['eager'].loss}"
            )
        outs, rem = rows.get("remat_outputs"), rows.get("remat")
        if (
            outs
            and rem
            and outs.planned_peak_ratio
            and rem.planned_peak_ratio
            and outs.planned_peak_ratio > rem.planned_peak_ratio + 0.1
        ):
            merged.append(
                f"{model['name']} {_x(outs.planned_peak_ratio)} ({outs.segments} segment"
                f"{'s' if outs.segments != 1 else ''}; per block {_x(rem.planned_peak_ratio)})"
            )
    if merged:
        report["notes"].append(
            "recompute outputs: in these models every block's output feeds the next block, so with "
            "`recompute_outputs=True` the blocks merge into one segment, recomputed all at once when the backward "
            "pass reaches it; the planned peak ratio is then close to 1: " + ", ".join(merged)
        )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.compare_pytorch",
        description="onnx-remat vs PyTorch checkpointing on the models in models/, one run, one machine.",
    )
    parser.add_argument("--models", nargs="*", metavar="NAME", help="models of models/ (default: all)")
    parser.add_argument(
        "--artifacts",
        nargs="*",
        default=[],
        metavar="DIR",
        help="artifacts directories or training graphs of your own (onnxruntime rows only)",
    )
    parser.add_argument(
        "--scope", help="scope pattern for --artifacts (default: the block scope of the model of that name)"
    )
    parser.add_argument("--steps", type=int, default=5, help="timed steps per configuration (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up steps before them (default 1)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of step-time runs, configurations taking turns (default 3; the first also measures the peaks)",
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for <device>.md and <device>.json")
    parser.add_argument("--no-pytorch", action="store_true", help="onnxruntime rows only")
    parser.add_argument(
        "--budget",
        action="append",
        default=[],
        metavar="SIZE",
        help="also onnx-remat --budget SIZE (repeatable; 'floor': the lowest peak the planner reaches)",
    )
    parser.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="measure nothing: rewrite <out>/<device>.md from a results JSON written earlier",
    )
    args = parser.parse_args(argv)
    if args.render is not None:
        report = finish(json.loads(args.render.read_text()))
        _write_atomic(args.out / f"{report['device']}.json", json.dumps(report, indent=2) + "\n")
        _write_atomic(args.out / f"{report['device']}.md", to_markdown(report))
        _log(f"wrote {args.out / (report['device'] + '.md')} and .json from {args.render}")
        return 0
    if args.steps < 1 or args.warmup < 1 or args.rounds < 1:
        parser.error("--steps, --warmup and --rounds must be at least 1")
    models = args.models if args.models is not None else (None if not args.artifacts else [])
    command = "python -m benchmarks.compare_pytorch " + " ".join(sys.argv[1:] if argv is None else argv)
    t0 = time.perf_counter()
    report = run(
        models,
        args.artifacts,
        scope=args.scope,
        steps=args.steps,
        warmup=args.warmup,
        rounds=args.rounds,
        device=args.device,
        torch_rows=not args.no_pytorch,
        command=command.strip(),
        budgets=args.budget,
    )
    report["duration_s"] = round(time.perf_counter() - t0, 1)
    md = to_markdown(report)
    _write_atomic(args.out / f"{args.device}.json", json.dumps(report, indent=2) + "\n")
    _write_atomic(args.out / f"{args.device}.md", md)
    print(md)
    _log(f"wrote {args.out / (args.device + '.md')} and .json ({report['duration_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
