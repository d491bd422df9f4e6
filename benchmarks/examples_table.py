"""The README table of per-block recompute on the example models (``models/``), measured.

    python -m benchmarks.examples_table [NAME ...] [--out benchmarks/results/examples.md]

For each example model (committed artifacts under ``models/artifacts``), ``onnx_remat.apply``
per block with the defaults (dropout masks packed, the rewrite scheduled) is compared with the
original by :func:`onnx_remat.runtime.compare.compare` (fresh processes, loss and every gradient
bit for bit); the same selection with ``dropout="byte"``, ``dropout="seed"`` and without the
schedule is measured alone (:func:`onnx_remat.runtime.measure.measure`: planned peaks are
byte-identical run to run, so one step each). The estimate of every graph is written beside.
Writes a Markdown table and prints it; the JSON beside it holds every figure.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "examples.md"
MiB = 2**20
VARIANTS = {  # name -> apply's keyword arguments besides the selection
    "byte": {"dropout": "byte"},
    "seed": {"dropout": "seed"},
    "unscheduled": {"schedule": False},
}


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / MiB:.2f}"


def _has_dropout(result) -> bool:
    return bool(result.plan.masks)


def measure_one(name: str) -> dict:
    """Rewrite one example per block in each variant; the row's figures."""
    import onnx_remat
    from models import MODELS
    from onnx_remat.runtime.compare import compare
    from onnx_remat.runtime.measure import measure

    spec = MODELS[name]
    src = ROOT / "models" / "artifacts" / name
    result = onnx_remat.apply(src, scopes=spec.block_scope)
    row: dict = {"name": name, "block_scope": spec.block_scope, "segments": len(result.rewrite.segments)}
    with tempfile.TemporaryDirectory() as tmp:
        c = compare(src, result.save(Path(tmp) / "remat"), steps=1, warmup=1, live=False)
        row.update(
            planned_before=c.a.planned_peak_bytes,
            planned_after=c.b.planned_peak_bytes,
            estimate_before=result.estimate_before.planned_peak_bytes if result.estimate_before else None,
            estimate_after=result.estimate_after.planned_peak_bytes if result.estimate_after else None,
            equal=c.equal,
            ratios=c.ratios,
        )
        for label, kwargs in VARIANTS.items():
            if label in ("byte", "seed") and not _has_dropout(result):
                row[label] = None
                continue
            variant = onnx_remat.apply(src, scopes=spec.block_scope, **kwargs)
            m = measure(variant.save(Path(tmp) / label), steps=1, warmup=1, live=False)
            row[label] = {
                "planned": m.planned_peak_bytes,
                "estimate": variant.estimate_after.planned_peak_bytes if variant.estimate_after else None,
            }
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| model | block | planned peak before → after (measured) | ratio | estimate before → after "
        "| loss and gradients | `--dropout byte` | `--dropout seed` | `--no-schedule` |",
        "|---|---|---|---:|---|---|---:|---:|---:|",
    ]
    for r in rows:
        ratio = r["planned_after"] / r["planned_before"] if r["planned_before"] else None
        extra = [
            f"{_mib(r[k]['planned'])} MiB" if r.get(k) else "(no dropout)" for k in ("byte", "seed", "unscheduled")
        ]
        lines.append(
            f"| {r['name']} | `{r['block_scope']}` | {_mib(r['planned_before'])} → {_mib(r['planned_after'])} MiB "
            f"| x{ratio:.2f} | {_mib(r['estimate_before'])} → {_mib(r['estimate_after'])} MiB "
            f"| {'bit-identical' if r['equal'] else 'DIFFERENT'} | {' | '.join(extra)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.examples_table", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="example models (default: all)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Markdown output (JSON beside it)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from models import MODELS

    rows = []
    for name in args.names or list(MODELS):
        row = measure_one(name)
        print(f"{name}: {_mib(row['planned_before'])} -> {_mib(row['planned_after'])} MiB", file=sys.stderr, flush=True)
        rows.append(row)
    text = table(rows)
    header = (
        f"# Example models: per-block recompute, measured\n\nRecorded {time.strftime('%Y-%m-%d')} on "
        f"{platform.machine()}, onnxruntime-training 1.19.2 (CPU), by `python -m benchmarks.examples_table`.\n\n"
    )
    from onnx_remat.model_io import write_file

    write_file(args.out, header + text + "\n", force=True)  # rewritten on every run
    write_file(args.out.with_suffix(".json"), json.dumps(rows, indent=1) + "\n", force=True)
    print(text)
    return 0 if all(r["equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
