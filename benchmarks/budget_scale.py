"""How long the budget planner takes on large graphs: the phases of ``apply --budget``.

    python -m benchmarks.budget_scale                       # 700 blocks (~21,000 training-graph nodes)
    python -m benchmarks.budget_scale --blocks 200 700 --budget 50%

Builds a synthetic training graph (benchmarks/synthetic.py, ~30 nodes per block; cached under
``--cache``), then times, in this process: analysis; the planner's set-up (the costs, ONE exact
estimate of the unrewritten graph, the model of units and options); the reference plans
(per-layer and --recompute-outputs, each rewritten and estimated exactly); the solve for one
budget (the dynamic programme, no estimate); and the whole ``plan()`` for that budget (solve,
rewrite, exact estimate, corrections, repeated while it does not fit). *Planning* is analysis +
set-up + solve: what the choice itself costs; the checks by the exact estimator come on top and
are listed. Prints a Markdown table; times are the minimum over ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _phases(path: Path, budget: str) -> dict:
    from onnx_remat.analysis.model import analyze_model
    from onnx_remat.remat.budget import BudgetPlanner, parse_budget
    from onnx_remat.remat.solve import solve

    t: dict = {}
    s = time.perf_counter()
    analysis = analyze_model(path)
    t["analysis"] = time.perf_counter() - s
    s = time.perf_counter()
    planner = BudgetPlanner(analysis, profile="flops")
    t["set-up (costs, baseline estimate, model)"] = time.perf_counter() - s
    limit = parse_budget(budget, planner.baseline_peak)
    s = time.perf_counter()
    sol = solve(planner.problem, limit)
    t["solve (dynamic programme)"] = time.perf_counter() - s
    t["planning"] = t["analysis"] + t["set-up (costs, baseline estimate, model)"] + t["solve (dynamic programme)"]
    s = time.perf_counter()
    planner.references()
    t["reference plans (exact estimates)"] = time.perf_counter() - s
    s = time.perf_counter()
    result = planner.plan(limit)
    t["plan() with exact checks"] = time.perf_counter() - s
    t["rounds"] = len(result.attempts)
    t["units"] = len(planner.units)
    t["nodes"] = len(analysis.graph.order)
    t["peak_before_mib"] = planner.baseline_peak / 2**20
    t["peak_after_mib"] = result.chosen.peak / 2**20
    t["budget_mib"] = limit / 2**20
    t["solved"] = sol is not None
    return t


def main(argv: list[str] | None = None) -> int:
    from benchmarks.synthetic import training_artifacts

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[700])
    parser.add_argument("--budget", default="50%")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--cache", type=Path, default=ROOT / ".cache" / "scale")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = []
    for blocks in args.blocks:
        model_dir = args.cache / f"synthetic{blocks}"
        if not (model_dir / "training_model.onnx").is_file():
            training_artifacts(blocks, model_dir)
        runs = [_phases(model_dir, args.budget) for _ in range(args.repeat)]
        best = {k: (min(r[k] for r in runs) if isinstance(runs[0][k], float) else runs[0][k]) for k in runs[0]}
        rows.append({"blocks": blocks, **best})
        print(json.dumps(rows[-1]), file=sys.stderr)
    timed = [k for k in rows[0] if isinstance(rows[0][k], float) and not k.endswith("_mib")]
    print("| nodes | units | " + " | ".join(timed) + " | budget → planned peak |")
    print("|---:|---:|" + "---:|" * len(timed) + "---|")
    for r in rows:
        cells = " | ".join(f"{r[k]:.2f} s" for k in timed)
        print(
            f"| {r['nodes']:,} | {r['units']} | {cells} | {r['budget_mib']:.1f} MiB → {r['peak_after_mib']:.1f} MiB "
            f"({r['rounds']} rounds) |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
