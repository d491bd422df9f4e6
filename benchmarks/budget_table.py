"""Recompute under a memory budget, measured: for every example model and corpus model, a sweep of
budgets from the unrewritten planned peak down to the lowest reachable one, each rewrite measured.

    python -m benchmarks.budget_table [NAME ...] [--points 6] [--steps 2]
        [--out benchmarks/results/budget.md] [--cache DIR]
    python -m benchmarks.budget_table --render benchmarks/results/budget.json \
        --plot blocks10 --plot gpt2_ts --plots docs     # the curves, with the measured points

Per model (``models/artifacts/<name>`` for ``models.MODELS``; the corpus of ``models/corpus.py``
from the tests' cache ``.cache/corpus/<key>/``, exported there when missing):

1. :class:`~onnx_remat.remat.budget.BudgetPlanner` gives the unrewritten peak, the floor (lowest
   reachable estimated peak) and the per-layer reference (``--scope`` on every repeated layer);
2. budgets: the unrewritten peak, then ``--points - 1`` budgets down to the floor (closer together
   towards it), plus per model extras (blocks10: 60 MiB);
3. each budget: ``onnx_remat.apply(src, budget=b)`` (scheduled, as by default), saved, and
   :func:`~onnx_remat.runtime.compare.compare` against the original (fresh onnxruntime processes,
   one warm-up step, ``--steps`` timed steps, loss and every gradient bit for bit): measured
   planned peak, within the budget or not, bit-identical or not, step-time ratio (both graphs of
   the pair in one run, so machine speed cancels);
4. per-layer recompute (``apply(src, scopes=<block scope>)``, scheduled) measured the same way, and
   the planner asked for per-layer's own estimated peak: its added compute against per-layer's
   (both the planner's cost model; "never dearer than per-layer").

Added compute is the planner's (compute its clones add, as a share of one step, from the cached
onnxruntime profile beside the model where there is one, else the FLOP estimate). Writes a
Markdown table and prints it; the JSON beside it holds every figure. Exit 1 when a measured peak
exceeds its budget or gradients differ.
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
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "budget.md"
MiB = 2**20
EXTRA_BUDGETS = {"blocks10": [60 * MiB], "blocks10_dynamo": [60 * MiB]}


def _mib(n: int | float | None) -> str:
    return "?" if n is None else f"{n / MiB:.2f}"


def corpus_cache() -> Path:
    """The cache the tests use (tests/conftest.py: ``.cache/corpus/<key>``)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import CORPUS_CACHE, _corpus_key  # type: ignore[import-not-found]

    return Path(CORPUS_CACHE) / _corpus_key()


def sources(names: list[str], cache: Path) -> list[tuple[str, Path, str]]:
    """(name, artifacts directory, block scope) of each model, exporting corpus models when missing."""
    from models import MODELS
    from models.corpus import CORPUS
    from models.export import export_artifacts

    out = []
    for name in names or [*MODELS, *CORPUS]:
        if name in MODELS:
            out.append((name, ROOT / "models" / "artifacts" / name, MODELS[name].block_scope))
            continue
        spec = CORPUS[name]
        if not (cache / name / "training_model.onnx").is_file():
            export_artifacts(spec, cache)
        out.append((name, cache / name, spec.block_scope))
    return out


def budgets_for(name: str, base: int, floor: int, points: int) -> list[int]:
    """The unrewritten peak, then ``points - 1`` budgets down to the floor, denser towards it."""
    grid = {base, floor}
    for i in range(1, points - 1):
        grid.add(int(floor + (base - floor) * (i / (points - 1)) ** 2))
    grid |= {b for b in EXTRA_BUDGETS.get(name, []) if floor <= b < base}
    return sorted(grid, reverse=True)


def _measure(src: Path, result, tmp: Path, label: str, steps: int):
    from onnx_remat.runtime.compare import compare

    out = result.save(tmp / label)
    return compare(src, out, steps=steps, warmup=1, live=False)


def measure_model(name: str, src: Path, block_scope: str, points: int, steps: int) -> dict:
    import onnx_remat
    from onnx_remat.errors import RematError
    from onnx_remat.remat.budget import PER_LAYER, BudgetPlanner

    start = time.perf_counter()
    planner = BudgetPlanner(onnx_remat.analyze_model(src))
    floor = planner.floor()
    base = planner.baseline_peak
    refs = {r.source: r for r in planner.references()}
    plan_s = time.perf_counter() - start
    rows: list[dict] = []
    baseline_measured = None
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for b in budgets_for(name, base, floor.peak, points):
            row: dict = {"budget": b}
            try:
                t0 = time.perf_counter()
                result = onnx_remat.apply(src, budget=b)
                row["apply_s"] = round(time.perf_counter() - t0, 2)
            except RematError as exc:
                row.update(error=str(exc))
                rows.append(row)
                continue
            chosen = result.budget.chosen  # type: ignore[union-attr]
            est = result.estimate_after.planned_peak_bytes if result.estimate_after else chosen.peak
            row.update(
                source=chosen.source,
                estimate=int(est),
                estimate_unscheduled=chosen.peak,
                scheduled=result.schedule is not None,
                added=chosen.added,
                clones=result.clone_count,
                choices=chosen.choices,
            )
            if not result.rewrite.segments:
                row.update(measured=None, equal=True, step_time_ratio=1.0)  # the original itself
                rows.append(row)
                continue
            c = _measure(src, result, tmp, f"b{len(rows)}", steps)
            baseline_measured = c.a.planned_peak_bytes
            row.update(
                measured=c.b.planned_peak_bytes,
                equal=c.equal,
                step_time_ratio=c.ratios.get("step_time_s"),
                measured_original=c.a.planned_peak_bytes,
            )
            rows.append(row)
            print(f"  {name} {_mib(b)} MiB: {json.dumps({k: v for k, v in row.items() if k != 'choices'})}", flush=True)
        for row in rows:
            if row.get("measured") is None and "error" not in row:
                row["measured"] = baseline_measured  # the unrewritten graph, from the comparisons
            m = row.get("measured")
            row["within"] = None if m is None else m <= row["budget"]
        # per-layer recompute: measured, and the planner at its peak
        per_layer: dict = {}
        ref = refs.get(PER_LAYER)
        if ref is not None:
            layer = onnx_remat.apply(src, scopes=block_scope)
            c = _measure(src, layer, tmp, "per_layer", steps)
            est_sched = layer.estimate_after.planned_peak_bytes if layer.estimate_after else None
            per_layer = {
                "estimate_unscheduled": ref.peak,
                "estimate": est_sched,
                "added": ref.added,
                "measured": c.b.planned_peak_bytes,
                "equal": c.equal,
                "step_time_ratio": c.ratios.get("step_time_s"),
                "planner_added_at_its_peak": planner.plan(ref.peak).chosen.added,
            }
            try:
                at_sched = onnx_remat.apply(src, budget=int(est_sched)) if est_sched else None
                per_layer["planner_added_at_scheduled_peak"] = at_sched.budget.chosen.added if at_sched else None  # type: ignore[union-attr]
            except RematError as exc:
                per_layer["planner_added_at_scheduled_peak"] = None
                per_layer["planner_at_scheduled_peak_error"] = str(exc)
    return {
        "name": name,
        "nodes": planner.analysis.graph.counts()["nodes"],
        "cost_source": planner.costs.source,
        "baseline_estimate": base,
        "baseline_measured": baseline_measured,
        "floor_estimate": floor.peak,
        "floor_source": floor.source,
        "floor_added": floor.added,
        "floor_choices": floor.choices,
        "plan_s": round(plan_s, 2),
        "rows": rows,
        "per_layer": per_layer,
    }


def _yn(v) -> str:
    return "?" if v is None else ("yes" if v else "**NO**")


def table(models: list[dict]) -> str:
    lines = [
        "| model | budget MiB | plan | estimated peak MiB | measured planned peak MiB | within budget "
        "| bit-identical | added compute | step time |",
        "|---|---:|---|---:|---:|---|---|---:|---:|",
    ]
    for m in models:
        for r in m["rows"]:
            if "error" in r:
                lines.append(f"| {m['name']} | {_mib(r['budget'])} | refused: {r['error']} | | | | | | |")
                continue
            t = r.get("step_time_ratio")
            lines.append(
                f"| {m['name']} | {_mib(r['budget'])} | {r['source']} | {_mib(r['estimate'])} | {_mib(r['measured'])} "
                f"| {_yn(r['within'])} | {_yn(r['equal'])} | {r['added']:.1%} | {'?' if t is None else f'x{t:.2f}'} |"
            )
    return "\n".join(lines)


def per_layer_table(models: list[dict]) -> str:
    lines = [
        "| model | per-layer: estimated peak MiB (unscheduled / scheduled) | measured MiB | per-layer added "
        "| planner's added at per-layer's unscheduled peak | at its scheduled peak | never dearer | step time |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for m in models:
        p = m["per_layer"]
        if not p:
            lines.append(f"| {m['name']} | no repeated layer | | | | | | |")
            continue
        at_s = p.get("planner_added_at_scheduled_peak")
        ok = p["planner_added_at_its_peak"] <= p["added"] + 1e-12
        t = p.get("step_time_ratio")
        at = "refused" if at_s is None else f"{at_s:.1%}"
        lines.append(
            f"| {m['name']} | {_mib(p['estimate_unscheduled'])} / {_mib(p['estimate'])} | {_mib(p['measured'])} "
            f"| {p['added']:.1%} | {p['planner_added_at_its_peak']:.1%} | {at} "
            f"| {_yn(ok)} | {'?' if t is None else f'x{t:.2f}'} |"
        )
    return "\n".join(lines)


def summary_table(models: list[dict]) -> str:
    lines = [
        "| model | unrewritten MiB (measured) | floor MiB (estimated) | budgets | within budget | bit-identical "
        "| per-layer MiB → planner added vs per-layer |",
        "|---|---:|---:|---:|---|---|---|",
    ]
    for m in models:
        ok = [r for r in m["rows"] if "error" not in r]
        within = sum(1 for r in ok if r["within"])
        equal = sum(1 for r in ok if r["equal"])
        p = m["per_layer"]
        pl = (
            f"{_mib(p['estimate_unscheduled'])}: {p['planner_added_at_its_peak']:.1%} vs {p['added']:.1%}" if p else "-"
        )
        lines.append(
            f"| {m['name']} | {_mib(m['baseline_measured'])} | {_mib(m['floor_estimate'])} | {len(m['rows'])} "
            f"| {within}/{len(ok)} | {equal}/{len(ok)} | {pl} |"
        )
    return "\n".join(lines)


def floor_breakdown(src: Path) -> dict:
    """What fills the planned peak at the planner's floor (``apply(budget=<floor>)``, scheduled),
    from the estimate: the buffers alive at the peak by where their tensor was made (stored from
    the forward pass, dropout masks apart; made by the clones; by the backward pass) and scope."""
    import onnx_remat
    from onnx_remat.graph import tags
    from onnx_remat.remat.budget import BudgetPlanner

    floor = BudgetPlanner(onnx_remat.analyze_model(src)).floor()
    result = onnx_remat.apply(src, budget=floor.peak)
    after = result.estimate_after
    assert after is not None
    masks = set()
    for node in result.model.graph.node:
        if node.op_type == "Dropout" and len(node.output) > 1:
            masks.add(node.output[1])
        if tags.is_pack_name(node.name):
            masks.update(node.output)
    parts: dict[str, int] = {}
    for t in after.live_at_peak:
        kind = {"forward": "stored", "recompute": "recomputed"}.get(t.region, t.region)
        if t.tensor in masks:
            kind = "stored dropout masks"
        key = f"{kind}: {t.scope or '-'}"
        parts[key] = parts.get(key, 0) + t.bytes
    return {
        "floor_unscheduled": floor.peak,
        "floor_added": floor.added,
        "floor_choices": floor.choices,
        "written_peak": after.planned_peak_bytes,
        "apply_added": result.budget.chosen.added,  # type: ignore[union-attr]
        "apply_choices": result.budget.chosen.choices,  # type: ignore[union-attr]
        "peak_node": after.peak_node,
        "at_peak": dict(sorted(parts.items(), key=lambda kv: -kv[1])),
    }


def floor_text(name: str, b: dict) -> str:
    lines = [
        f"## {name}: the floor\n",
        f"The planner's lowest estimated planned peak: {_mib(b['floor_unscheduled'])} MiB unscheduled "
        f"({b['floor_added']:.1%} added compute); `apply(budget=<that>)` writes {_mib(b['written_peak'])} MiB "
        f"after the schedule ({b['apply_added']:.1%} added: the calibration rounds of one budget find the "
        "same peak by a dearer plan than the floor search did). Plan written:\n",
        *[f"- {c}" for c in b["apply_choices"]],
        f"\nAt its peak (node `{b['peak_node']}`), MiB by where the buffer's tensor was made and scope:\n",
        "| what | MiB |",
        "|---|---:|",
        *[f"| {k} | {_mib(v)} |" for k, v in b["at_peak"].items()],
    ]
    return "\n".join(lines)


def plot_curve(name: str, src: Path, model: dict, out: Path) -> Path:
    """``onnx-remat plan --sweep --plot`` of one model, with this run's measured planned peaks."""
    import onnx_remat
    from onnx_remat.remat.budget import BudgetPlanner
    from onnx_remat.show.tradeoff import plot_sweep

    sweep = BudgetPlanner(onnx_remat.analyze_model(src)).sweep()
    measured = [(r["added"], r["measured"]) for r in model["rows"] if r.get("measured") and "error" not in r]
    title = f"{name}: planned peak against added compute (measured: the rewrites as written, scheduled)"
    return plot_sweep(sweep, out, title=title, measured=measured, force=True)


def write_report(models: list[dict], out: Path, steps: int, date: str, extra: str = "") -> str:
    header = (
        f"# Recompute under a memory budget, measured\n\nRecorded {date} on "
        f"{platform.machine()} ({platform.processor() or 'cpu'}), onnxruntime-training 1.19.2 (CPU), by "
        "`python -m benchmarks.budget_table`. Each budget: `onnx_remat.apply(model, budget=b)` (the "
        "chosen rewrite, scheduled), compared with the original in fresh onnxruntime processes "
        f"(1 warm-up step, {steps} timed steps): measured planned peak (onnxruntime's planned "
        "activation memory), loss and every gradient bit for bit, step time as the ratio of the two "
        "graphs measured side by side (a shared 2-core machine: single ratios are noisy). Added "
        "compute: the planner's cost model (share of one step, FLOP estimate unless a profile is "
        "cached). The first budget of each model is the unrewritten peak (nothing rewritten).\n\n"
    )
    text = (
        "## Summary\n\n"
        + summary_table(models)
        + "\n\n## Never dearer than per-layer recompute\n\n"
        + "The planner asked for per-layer recompute's own estimated planned peak (unscheduled: the "
        "planner's figures; scheduled: what `apply --scope` writes), its added compute against "
        "per-layer's.\n\n" + per_layer_table(models) + "\n\n## Every budget\n\n" + table(models)
    )
    if extra:
        text += "\n\n" + extra
    from onnx_remat.model_io import write_file

    write_file(out, header + text + "\n", force=True)
    write_file(out.with_suffix(".json"), json.dumps(models, indent=1) + "\n", force=True)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.budget_table", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="models (default: models/ and the corpus)")
    parser.add_argument("--points", type=int, default=6, help="budgets per model, the unrewritten peak included")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per graph and comparison")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Markdown output (JSON beside it)")
    parser.add_argument("--cache", type=Path, help="corpus exports (default: the tests' cache)")
    parser.add_argument(
        "--render", type=Path, metavar="JSON", help="measure nothing: rewrite the Markdown (and plots) from a JSON"
    )
    parser.add_argument("--plot", action="append", default=[], metavar="NAME", help="models to plot (with --render)")
    parser.add_argument("--plots", type=Path, default=ROOT / "docs", help="folder for budget_<NAME>.png")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    cache = args.cache or corpus_cache()
    if args.render is not None:
        models = json.loads(args.render.read_text())
        done = {m["name"]: m for m in models}
        for name, src, _scope in sources(args.plot, cache):
            print(f"wrote {plot_curve(name, src, done[name], args.plots / f'budget_{name}.png')}")
        floors = [floor_text(n, floor_breakdown(src)) for n, src, _ in sources(["blocks10"], cache) if n in done]
        date = time.strftime("%Y-%m-%d", time.localtime(args.render.stat().st_mtime))
        write_report(models, args.out, args.steps, date, "\n\n".join(floors))
        return 0
    models = []
    for name, src, scope in sources(args.names, cache):
        print(f"{name}:", flush=True)
        models.append(measure_model(name, src, scope, args.points, args.steps))
    floors = [
        floor_text(n, floor_breakdown(src))
        for n, src, _ in sources(["blocks10"], cache)
        if n in args.names or not args.names
    ]
    text = write_report(models, args.out, args.steps, time.strftime("%Y-%m-%d"), "\n\n".join(floors))
    print(text)
    bad = [
        (m["name"], r["budget"])
        for m in models
        for r in m["rows"]
        if "error" not in r and (r["within"] is False or not r["equal"])
    ]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
