"""How ``estimate`` scales with graph size: per-phase times on synthetic training graphs.

    python -m benchmarks.estimate_scale                    # 200, 400, 800 blocks (~6k, 12k, 24k nodes)
    python -m benchmarks.estimate_scale --blocks 800 --repeat 3 --model /path/to/artifacts

For each size it builds a synthetic training graph (benchmarks/synthetic.py, ~30 nodes per block;
cached under ``--cache``), then times, in this process, the phases of
``onnx_remat.estimate.estimate(path)`` and of ``estimate(path, scopes=["blocks.*"])`` (which also
rewrites every block in memory and estimates the result), and the whole ``onnx-remat estimate``
command as a fresh process (interpreter start-up and imports included). ``--model`` adds any
training graph or artifacts directory. Prints a Markdown table; times are the minimum over
``--repeat`` runs. The per-1k-node column shows whether the cost grows linearly.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _phases(path: Path) -> dict[str, float]:
    from onnx_remat.analysis.model import analyze_model
    from onnx_remat.estimate import scope_rows
    from onnx_remat.memory import estimate_graph, regions_of, scope_of_tensor
    from onnx_remat.ortsim.graph import runtime_graph
    from onnx_remat.ortsim.optimizer import optimize
    from onnx_remat.ortsim.planner import plan_memory
    from onnx_remat.ortsim.shapes import infer_runtime_shapes

    t: dict[str, float] = {}
    s = time.perf_counter()
    analysis = analyze_model(path)
    t["load+analysis"] = time.perf_counter() - s
    sizes = analysis.sizes.copy()
    s = time.perf_counter()
    infer_runtime_shapes(analysis.model, sizes)
    t["runtime shapes"] = time.perf_counter() - s
    s = time.perf_counter()
    rg = runtime_graph(analysis.model, sizes)
    optimize(rg)
    t["ort rewrites"] = time.perf_counter() - s
    s = time.perf_counter()
    order = rg.default_order()
    t["order"] = time.perf_counter() - s
    s = time.perf_counter()
    plan_memory(rg, order)
    t["memory plan"] = time.perf_counter() - s
    s = time.perf_counter()
    est, _, _ = estimate_graph(
        analysis.model, analysis.sizes.copy(), regions=regions_of(analysis), scope_of_tensor=scope_of_tensor(analysis)
    )
    scope_rows(analysis, est)
    t["estimate_graph+scopes"] = time.perf_counter() - s
    t["nodes"] = len(analysis.graph.order)
    t["executed"] = len(est.steps)
    t["peak_mib"] = est.planned_peak_bytes / 2**20
    return t


def _timed(fn, repeat: int) -> tuple[float, object]:
    best, value = float("inf"), None
    for _ in range(repeat):
        s = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - s)
    return best, value


def run(paths: list[tuple[str, Path]], repeat: int) -> list[dict]:
    from onnx_remat.estimate import estimate

    rows = []
    for label, path in paths:
        phases = _phases(path)
        total, _ = _timed(lambda path=path: estimate(path), repeat)
        with_rewrite, _ = (
            _timed(lambda path=path: estimate(path, scopes=["blocks.*"]), 1)
            if label.startswith("synthetic")
            else (None, None)
        )
        cli = [sys.executable, "-m", "onnx_remat.cli.main", "estimate", str(path), "--top", "0"]
        cmd, _ = _timed(lambda cli=cli: subprocess.run(cli, check=True, capture_output=True), repeat)
        row = {"graph": label, **phases, "estimate_s": total, "estimate_with_rewrite_s": with_rewrite, "command_s": cmd}
        rows.append(row)
        print(f"{label}: {phases['nodes']} nodes, estimate {total:.2f} s, command {cmd:.2f} s", file=sys.stderr)
    return rows


def table(rows: list[dict]) -> str:
    head = (
        "| graph | nodes | onnxruntime runs | load+analysis s | rewrites s | order s | plan s | estimate() s "
        "| per 1k nodes ms | with rewrite of every block s | `onnx-remat estimate` s | planned peak MiB |"
    )
    lines = [head, "|" + "|".join("---" for _ in range(12)) + "|"]
    for r in rows:
        rw = f"{r['estimate_with_rewrite_s']:.2f}" if r.get("estimate_with_rewrite_s") is not None else "-"
        lines.append(
            f"| {r['graph']} | {r['nodes']} | {r['executed']} | {r['load+analysis']:.2f} | {r['ort rewrites']:.2f} "
            f"| {r['order']:.3f} | {r['memory plan']:.2f} | {r['estimate_s']:.2f} "
            f"| {1000 * r['estimate_s'] / r['nodes'] * 1000:.0f} | {rw} | {r['command_s']:.2f} | {r['peak_mib']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, nargs="*", default=[200, 400, 800])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--model", action="append", default=[], help="also time this training graph / artifacts dir")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "onnx-remat-bench")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    from benchmarks.synthetic import training_artifacts

    paths: list[tuple[str, Path]] = []
    for b in args.blocks:
        out = args.cache / f"synthetic{b}"
        if not (out / "training_model.onnx").exists():
            training_artifacts(b, out)
        paths.append((f"synthetic {b} blocks", out))
    paths += [(str(m), Path(m)) for m in args.model]
    rows = run(paths, args.repeat)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
