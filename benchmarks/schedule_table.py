"""The memory schedule on the corpus, measured: planned peaks and step times, scheduled against not.

    python -m benchmarks.schedule_table [NAME ...] [--grad-accumulation inplace|early|sum ...]
        [--gpt2-small DIR] [--steps 10] [--out benchmarks/results/schedule.md] [--cache DIR]

For each corpus model (models/corpus.py; exported into ``--cache`` when missing) and, with
``--gpt2-small DIR``, the GPT-2-small-width artifacts (``python -m models.export --corpus
gpt2_small_ts``), four graphs: the original, ``onnx_remat.schedule`` of it (no recompute),
``onnx_remat.apply`` per layer without the schedule and with it (the default). Two side-by-side
comparisons (:func:`onnx_remat.runtime.compare.compare`, fresh processes, the same feeds and seed,
loss and every gradient bit for bit) give the measured figures: original vs scheduled, and
per-layer rewrite unscheduled vs scheduled. Step-time ratios come from those comparisons (both
graphs of a pair measured in one run, ``--steps`` timed steps each), so machine speed cancels;
where the schedule leaves a graph unchanged, its first ratio times one graph against itself and
shows the noise of the machine. The estimate (:mod:`onnx_remat.estimate`) of each graph is written
beside its measured peak.

``--grad-accumulation`` may be given several times: every model is then measured once per mode,
except where a later mode writes the same graphs as the first (nothing to accumulate).

Writes a Markdown table and prints it; the JSON beside it holds every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "schedule.md"
DEFAULT_CACHE = ROOT / ".cache" / "corpus" / "bench"
MiB = 2**20


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / MiB:.2f}"


def _ratio(a: int | float | None, b: int | float | None) -> float | None:
    return None if not a or b is None else b / a


def measure_one(
    name: str, src: Path, block_scope: str, grad_accumulation: str, steps: int, seen: dict[str, bytes] | None = None
) -> dict | None:
    """The row of one model: its four graphs' planned peaks (measured, estimated) and time ratios.

    ``seen``: the serialized scheduled graphs of an earlier mode of the same model; when this mode
    writes the same bytes, nothing is measured and None comes back (else ``seen`` is filled)."""
    import onnx_remat
    from onnx_remat.runtime.compare import compare

    start = time.perf_counter()
    scheduled = onnx_remat.schedule(src, grad_accumulation=grad_accumulation)
    schedule_s = time.perf_counter() - start
    remat = onnx_remat.apply(src, scopes=block_scope, grad_accumulation=grad_accumulation)
    written = scheduled.model.SerializeToString() + remat.model.SerializeToString()
    if seen is not None:
        if seen.get(name) == written:
            return None
        seen.setdefault(name, written)
    plain = onnx_remat.apply(src, scopes=block_scope, schedule=False)
    with tempfile.TemporaryDirectory() as tmp:
        out_s = scheduled.save(Path(tmp) / "scheduled")
        out_p = plain.save(Path(tmp) / "remat_plain")
        out_r = remat.save(Path(tmp) / "remat")
        c1 = compare(src, out_s, steps=steps, warmup=1, live=False)
        c2 = compare(out_p, out_r, steps=steps, warmup=1, live=False, checkpoint=src / "checkpoint")
    chosen = scheduled.schedule.chosen
    return {
        "name": name,
        "grad_accumulation": grad_accumulation,
        "planned_original": c1.a.planned_peak_bytes,
        "planned_scheduled": c1.b.planned_peak_bytes,
        "planned_remat": c2.a.planned_peak_bytes,
        "planned_remat_scheduled": c2.b.planned_peak_bytes,
        "estimate_original": scheduled.estimate_before.planned_peak_bytes,
        "estimate_scheduled": scheduled.estimate_after.planned_peak_bytes,
        "estimate_remat": plain.estimate_after.planned_peak_bytes if plain.estimate_after else None,
        "estimate_remat_scheduled": remat.estimate_after.planned_peak_bytes if remat.estimate_after else None,
        "order": chosen.label if chosen and scheduled.schedule.changed else "unchanged",
        "accumulated": [a.parameter for a in scheduled.schedule.accumulated],
        "clones_scheduled": sum(1 for n in scheduled.model.graph.node if n.name.endswith("/remat")),
        "step_time_scheduled_vs_original": c1.ratios.get("step_time_s"),
        "step_time_remat_scheduled_vs_unscheduled": c2.ratios.get("step_time_s"),
        "equal_scheduled": c1.equal,
        "equal_remat": c2.equal,
        "schedule_s": round(schedule_s, 2),
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| model | accumulation | planned peak: original → scheduled (ratio) | per layer: unscheduled → scheduled | "
        "per layer / original | step time: scheduled / original, per layer scheduled / unscheduled "
        "| estimate error (largest of the four) | bit-identical | order |",
        "|---|---|---|---|---:|---|---:|---|---|",
    ]
    for r in rows:
        ratio_s = _ratio(r["planned_original"], r["planned_scheduled"])
        ratio_r = _ratio(r["planned_original"], r["planned_remat_scheduled"])
        errors = [
            abs(r[f"estimate_{k}"] / r[f"planned_{k}"] - 1)
            for k in ("original", "scheduled", "remat", "remat_scheduled")
            if r.get(f"estimate_{k}") and r.get(f"planned_{k}")
        ]
        t1, t2 = r["step_time_scheduled_vs_original"], r["step_time_remat_scheduled_vs_unscheduled"]
        same = " (same graph)" if r["order"] == "unchanged" and not r.get("accumulated") else ""
        acc = r["grad_accumulation"] + (f" ({len(r['accumulated'])} summed in place)" if r.get("accumulated") else "")
        lines.append(
            f"| {r['name']} | {acc} | {_mib(r['planned_original'])} → {_mib(r['planned_scheduled'])} MiB "
            f"(x{ratio_s:.2f}) | {_mib(r['planned_remat'])} → {_mib(r['planned_remat_scheduled'])} MiB "
            f"| x{ratio_r:.2f} "
            f"| x{t1:.2f}{same}, x{t2:.2f} | {max(errors, default=0):.2%} "
            f"| {'yes' if r['equal_scheduled'] and r['equal_remat'] else 'NO'} | {r['order']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.schedule_table", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="corpus models (default: all)")
    parser.add_argument(
        "--grad-accumulation",
        action="append",
        choices=["inplace", "early", "sum"],
        help="gradient accumulation mode of the schedule (repeatable; default: inplace)",
    )
    parser.add_argument("--gpt2-small", type=Path, help="artifacts of the GPT-2-small-width graph (a row of its own)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per graph and comparison")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Markdown output (JSON beside it)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where the corpus exports are kept")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from models.corpus import CORPUS
    from models.export import export_artifacts

    names = args.names or ([] if args.gpt2_small and not args.names else list(CORPUS))
    jobs = []
    for name in names:
        spec = CORPUS[name]
        if not (args.cache / name / "training_model.onnx").is_file():
            export_artifacts(spec, args.cache)
        jobs.append((name, args.cache / name, spec.block_scope))
    if args.gpt2_small:
        jobs.append(("gpt2_small_ts", args.gpt2_small, "GPT2Block"))
    modes = args.grad_accumulation or ["inplace"]
    rows = []
    seen: dict[str, bytes] = {}
    for name, src, scope in jobs:
        for mode in modes:
            row = measure_one(name, src, scope, mode, args.steps, seen)
            if row is None:
                print(
                    f"{name} ({mode}): the same graphs as {modes[0]}, not measured again", file=sys.stderr, flush=True
                )
                continue
            print(f"{name}: {json.dumps(row)}", file=sys.stderr, flush=True)
            rows.append(row)
    text = table(rows)
    header = (
        f"# The memory schedule, measured\n\nRecorded {time.strftime('%Y-%m-%d')} on {platform.machine()} "
        f"({platform.processor() or 'cpu'}, {os.cpu_count()} cores, shared), onnxruntime-training 1.19.2 (CPU), "
        f"{args.steps} timed steps per graph, by `python -m benchmarks.schedule_table`. Planned peaks are "
        "onnxruntime's (byte-identical run to run); step-time ratios are medians of two graphs measured "
        'one after the other in one run, and "(same graph)" marks a graph the schedule left unchanged, '
        "timed against itself: the noise of this machine.\n\n"
    )
    from onnx_remat.model_io import write_file

    write_file(args.out, header + text + "\n", force=True)  # a result to regenerate
    write_file(args.out.with_suffix(".json"), json.dumps(rows, indent=1) + "\n", force=True)
    print(text)
    return 0 if all(r["equal_scheduled"] and r["equal_remat"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
