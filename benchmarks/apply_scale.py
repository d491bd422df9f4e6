"""How ``apply`` scales with graph size: per-phase times on synthetic training graphs.

    python -m benchmarks.apply_scale                  # 200, 400, 800, 1600 blocks
    python -m benchmarks.apply_scale --blocks 800 --repeat 3

For each size it builds a synthetic training graph (benchmarks/synthetic.py, ~26 nodes per
block), then times, in this process, the phases of ``onnx_remat.apply(path, scopes=["blocks.*"])``
(load + check, graphsurgeon import + analysis, scopes, sizes, plan, rewrite + export, save), and
the whole ``onnx-remat apply`` command as a fresh process (interpreter start-up and imports
included). Prints a Markdown table and, with ``--json``, writes the figures. Times are the
minimum over ``--repeat`` runs; compare the per-1k-node column across sizes for linearity.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.synthetic import training_artifacts


def _phases(model_dir: Path, out: Path) -> dict[str, float]:
    from onnx_remat import model_io
    from onnx_remat.analysis.model import ModelAnalysis
    from onnx_remat.analysis.regions import analyze
    from onnx_remat.analysis.scopes import resolve_scopes
    from onnx_remat.analysis.sizes import TensorSizes
    from onnx_remat.graph.bridge import ModelGraph
    from onnx_remat.ortsim.registry import check_runtime_support
    from onnx_remat.remat.apply import plan
    from onnx_remat.remat.rewrite import RecomputeRewrite

    t = {}
    s = time.perf_counter()
    loaded = model_io.load_model(model_dir)
    t["load+check"] = time.perf_counter() - s
    s = time.perf_counter()
    tg = analyze(ModelGraph(loaded.model))
    t["import+analysis"] = time.perf_counter() - s
    s = time.perf_counter()
    tree = resolve_scopes(tg, model_io.load_model(loaded.eval_model_path, check=False).model)
    t["scopes"] = time.perf_counter() - s
    s = time.perf_counter()
    sizes = TensorSizes(loaded.model)
    t["sizes"] = time.perf_counter() - s
    analysis = ModelAnalysis(model=loaded.model, source=loaded, graph=tg, scopes=tree, sizes=sizes)
    s = time.perf_counter()
    recompute_plan = plan(analysis, scopes=["blocks.*"])
    t["plan"] = time.perf_counter() - s
    s = time.perf_counter()
    result = RecomputeRewrite()(tg, recompute_plan)
    t["rewrite+export"] = time.perf_counter() - s
    s = time.perf_counter()
    check_runtime_support(result.model)
    model_io.save_model(result.model, out, force=True)
    t["check+save"] = time.perf_counter() - s
    t["total"] = sum(t.values())
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[200, 400, 800, 1600])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    cli = Path(sys.executable).with_name("onnx-remat")
    rows = []
    work = Path(tempfile.mkdtemp(prefix="apply-scale-"))
    try:
        for blocks in args.blocks:
            model_dir = training_artifacts(blocks, work / f"b{blocks}")
            import onnx

            nodes = len(onnx.load(str(model_dir / "training_model.onnx"), load_external_data=False).graph.node)
            runs = [_phases(model_dir, work / f"b{blocks}.remat.onnx") for _ in range(args.repeat)]
            best = {k: min(r[k] for r in runs) for k in runs[0]}
            cmd_times = []
            for _ in range(args.repeat):
                s = time.perf_counter()
                subprocess.run(
                    [
                        str(cli),
                        "apply",
                        str(model_dir),
                        "--scope",
                        "blocks.*",
                        "-o",
                        str(work / "cli.onnx"),
                        "--force",
                        "-q",
                    ],
                    check=True,
                    capture_output=True,
                )
                cmd_times.append(time.perf_counter() - s)
            rows.append({"blocks": blocks, "nodes": nodes, "phases_s": best, "command_s": min(cmd_times)})
            print(
                f"{blocks} blocks, {nodes} nodes: apply {best['total']:.2f} s, command {min(cmd_times):.2f} s",
                file=sys.stderr,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    phases = list(rows[0]["phases_s"])
    print("| nodes | " + " | ".join(phases) + " | µs per node (total) | whole command |")
    print("|---:|" + "---:|" * (len(phases) + 2))
    for r in rows:
        cells = " | ".join(f"{r['phases_s'][p]:.2f}" for p in phases)
        per_node = r["phases_s"]["total"] / r["nodes"] * 1e6
        print(f"| {r['nodes']} | {cells} | {per_node:.0f} | {r['command_s']:.2f} s |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
