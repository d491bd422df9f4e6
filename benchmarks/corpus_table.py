"""The README table of the corpus of real architectures: per model and exporter, the training
graph's nodes, the planned peak before -> after per-layer recompute (measured by onnxruntime),
the estimate beside it, whether loss and gradients are bit-identical, and the same for a memory
budget (``apply --budget``, default 80% of the unrewritten planned peak; a budget below the
lowest peak the planner reaches is a one-line refusal naming that peak, shown as such).

    python -m benchmarks.corpus_table [NAME ...] [--out benchmarks/results/corpus.md] [--cache DIR]

Exports what is missing into ``--cache`` (default ``.cache/corpus/bench``), then for each model
``onnx_remat.apply(dir, scopes=<its block scope>)`` and ``compare`` (one step, single-threaded
where kernels race). Writes a Markdown table and prints it; the JSON beside it holds every
figure. Takes a few minutes for the whole corpus on 2 cores.
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
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "corpus.md"
DEFAULT_CACHE = ROOT / ".cache" / "corpus" / "bench"
MiB = 2**20


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / MiB:.2f}"


def measure_one(name: str, cache: Path, budget: str = "80%") -> dict:
    """Export (if needed), rewrite per layer, compare; the row's figures."""
    import onnx

    import onnx_remat
    from models.corpus import CORPUS
    from models.export import export_artifacts
    from onnx_remat.runtime.compare import compare

    spec = CORPUS[name]
    src = cache / name
    if not (src / "training_model.onnx").is_file():
        export_artifacts(spec, cache)
    nodes = len(onnx.load(str(src / "training_model.onnx"), load_external_data=False).graph.node)
    start = time.perf_counter()
    result = onnx_remat.apply(src, scopes=spec.block_scope)
    apply_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        out = result.save(Path(tmp) / "remat")
        c = compare(src, out, steps=1, warmup=1, live=False)
    return {
        "name": name,
        "architecture": name.rsplit("_", 1)[0],
        "exporter": spec.exporter,
        "opset": spec.opset,
        "block_scope": spec.block_scope,
        "nodes": nodes,
        "segments": len(result.rewrite.segments),
        "clones": result.clone_count,
        "fences": len(result.rewrite.fences),
        "planned_before": c.a.planned_peak_bytes,
        "planned_after": c.b.planned_peak_bytes,
        "estimate_before": result.estimate_before.planned_peak_bytes if result.estimate_before else None,
        "estimate_after": result.estimate_after.planned_peak_bytes if result.estimate_after else None,
        "equal": c.equal,
        "equality_run": c.equality_run,
        "clones_kept": c.b.rewrite.clones_kept if c.b.rewrite else None,
        "barriers_kept": c.b.rewrite.barriers_kept if c.b.rewrite else None,
        "apply_s": round(apply_s, 2),
        **_budget_row(src, budget),
    }


def _budget_row(src: Path, budget: str) -> dict:
    """``apply --budget`` on ``src``: its measured planned peak and equality, or the refusal."""
    import onnx_remat
    from onnx_remat.errors import RematError
    from onnx_remat.runtime.compare import compare

    try:
        result = onnx_remat.apply(src, budget=budget)
    except RematError as exc:
        return {"budget": budget, "budget_refused": str(exc)}
    if not result.rewrite.segments:
        return {"budget": budget, "budget_planned": None, "budget_note": "the unrewritten graph fits"}
    with tempfile.TemporaryDirectory() as tmp:
        c = compare(src, result.save(Path(tmp) / "budget"), steps=1, warmup=1, live=False)
    assert result.budget is not None
    return {
        "budget": budget,
        "budget_bytes": result.budget.budget,
        "budget_planned": c.b.planned_peak_bytes,
        "budget_estimate": result.estimate_after.planned_peak_bytes if result.estimate_after else None,
        "budget_equal": c.equal,
        "budget_source": result.budget.chosen.source,
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| model | exporter | training nodes | layers recomputed | planned peak before → after (measured) | ratio "
        "| estimate before → after | loss and gradients | `--budget 80%`: planned peak (measured), gradients |",
        "|---|---|---:|---|---|---:|---|---|---|",
    ]
    for r in rows:
        ratio = r["planned_after"] / r["planned_before"] if r["planned_before"] else None
        exporter = "TorchScript" if r["exporter"] == "torchscript" else "dynamo"
        lines.append(
            f"| {r['architecture']} | {exporter} {r['opset']} | {r['nodes']:,} "
            f"| {r['segments']} × `{r['block_scope']}` "
            f"| {_mib(r['planned_before'])} → {_mib(r['planned_after'])} MiB | x{ratio:.2f} "
            f"| {_mib(r['estimate_before'])} → {_mib(r['estimate_after'])} MiB "
            f"| {'bit-identical' if r['equal'] else 'DIFFERENT'} | {_budget_cell(r)} |"
        )
    return "\n".join(lines)


def _budget_cell(r: dict) -> str:
    if "budget" not in r:
        return "-"
    if r.get("budget_refused"):
        floor = r["budget_refused"].split("reaches for this graph, ")[-1].split(" (")[0]
        return f"refused: below the floor, {floor}"
    if r.get("budget_planned") is None:
        return r.get("budget_note", "-")
    ratio = r["budget_planned"] / r["planned_before"] if r["planned_before"] else 0
    same = "bit-identical" if r["budget_equal"] else "DIFFERENT"
    return f"{_mib(r['budget_planned'])} MiB (x{ratio:.2f}), {same}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.corpus_table", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="corpus models (default: all)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Markdown output (JSON beside it)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where the exports are kept")
    parser.add_argument("--budget", default="80%", help="the memory budget of the budget column (default 80%%)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from models.corpus import CORPUS

    names = args.names or list(CORPUS)
    rows = []
    for name in names:
        row = measure_one(name, args.cache, args.budget)
        print(
            f"{name}: {_mib(row['planned_before'])} -> {_mib(row['planned_after'])} MiB, equal={row['equal']}",
            file=sys.stderr,
            flush=True,
        )
        rows.append(row)
    text = table(rows)
    stamp = time.strftime("%Y-%m-%d")
    header = (
        f"# Corpus: per-layer recompute, measured\n\nRecorded {stamp} on {platform.machine()} "
        f"({platform.processor() or 'cpu'}), onnxruntime-training 1.19.2 (CPU), "
        "by `python -m benchmarks.corpus_table`.\n\n"
    )
    from onnx_remat.model_io import write_file

    write_file(args.out, header + text + "\n", force=True)  # the table is rewritten on every run
    write_file(args.out.with_suffix(".json"), json.dumps(rows, indent=1) + "\n", force=True)
    print(text)
    return 0 if all(r["equal"] and r.get("budget_equal", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
