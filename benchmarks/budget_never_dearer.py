"""At the memory per-layer recompute reaches, is the budget planner ever dearer? (issue 12)

    python -m benchmarks.budget_never_dearer [--cache DIR]

For every model in ``models/`` and the corpus (exported into ``--cache`` when missing): per-layer
recompute as ``apply --scope <layer>`` writes it (scheduled), then ``apply --budget <that
estimated peak>``. Prints a Markdown table: the plan chosen, its added compute against
per-layer's, and whether its estimated peak fits. Static: nothing runs (the estimate is
byte-exact on these graphs, see benchmarks/results/corpus.md and examples.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20


def rows(cache: Path) -> list[dict]:
    import onnx_remat
    from models import MODELS
    from models.corpus import CORPUS
    from models.export import export_artifacts
    from onnx_remat.errors import RematError
    from onnx_remat.remat.budget import PER_LAYER

    sources = [(n, ROOT / "models" / "artifacts" / n, MODELS[n].block_scope) for n in MODELS]
    for n, spec in CORPUS.items():
        if not (cache / n / "training_model.onnx").is_file():
            export_artifacts(spec, cache)
        sources.append((n, cache / n, spec.block_scope))
    out = []
    for name, src, scope in sources:
        peak = onnx_remat.apply(src, scopes=scope).estimate_after.planned_peak_bytes
        row = {"name": name, "per_layer_peak": peak}
        try:
            b = onnx_remat.apply(src, budget=peak)
        except RematError as exc:
            row.update(chosen="refused", why=str(exc))
        else:
            per_layer = next(r for r in b.budget.references if r.source == PER_LAYER)
            row.update(
                chosen=b.budget.chosen.source,
                added=b.budget.chosen.added,
                per_layer_added=per_layer.added,
                fits=b.estimate_after.planned_peak_bytes <= peak,
            )
        print(row, file=sys.stderr, flush=True)
        out.append(row)
    return out


def table(data: list[dict]) -> str:
    lines = [
        "| model | per-layer peak (scheduled) | plan for that budget | its added compute | per-layer's | fits |",
        "|---|---:|---|---:|---:|---|",
    ]
    for r in data:
        if r["chosen"] == "refused":
            lines.append(f"| {r['name']} | {r['per_layer_peak'] / MiB:.2f} MiB | refused | | | no |")
            continue
        lines.append(
            f"| {r['name']} | {r['per_layer_peak'] / MiB:.2f} MiB | {r['chosen']} | {r['added']:.1%} "
            f"| {r['per_layer_added']:.1%} | {'yes' if r['fits'] else 'NO'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.budget_never_dearer", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--cache", type=Path, default=ROOT / ".cache" / "corpus" / "bench", help="corpus exports")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    data = rows(args.cache)
    print(table(data))
    dearer = [r for r in data if r["chosen"] == "refused" or r["added"] > r["per_layer_added"] + 1e-12 or not r["fits"]]
    return 1 if dearer else 0


if __name__ == "__main__":
    sys.exit(main())
