"""The compiled walks against the Python ones, in one process, on one large rewrite's emulated graph.

    python -m benchmarks.native_speed                      # the 3,850-block synthetic graph (~10^5 nodes)
    python -m benchmarks.native_speed --blocks 800 --repeat 5

Builds the synthetic training graph (:mod:`benchmarks.synthetic`), rewrites it per block
(``apply --scope 'blocks.*'``, unscheduled: the graph the memory schedule plans, ~1.6 x 10^5 nodes
at 3,850 blocks), emulates the rewrite, then times, alternating the two ways ``--repeat`` times
each (:mod:`onnx_remat.compiled`: the compiled walks, and ``ONNX_REMAT_NATIVE=0``):

* the memory plan of the graph's DEFAULT order, *cold* (the graph's per-graph tables read first: a
  plan of a graph planned once, as the budget planner's evaluations make) and *warm* (read already:
  the memory schedule's several orders of one graph);
* the DEFAULT order itself (the emulated optimizer asks it after each pass that changes the graph);
* the list schedulers' orders (``freeing``, then ``greedy``: the memory schedule's policies) from a
  fresh :class:`~onnx_remat.scheduling.orders.ListScheduler`, on the graph as the plans above left
  it (the compiled walk reads the plans' numbering of the graph; the Python walk reads its own state
  of the graph first, counted in the ``freeing`` row).

Each pair is checked to give the same plan (every field) and the same orders. Writes ``<out>.md``
and ``<out>.json`` (default ``benchmarks/results/native_speed``). Medians of ``--repeat`` runs;
the ratios, measured side by side, are what to read on a shared machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "native_speed"


def _timed(f: Callable[[], object]) -> tuple[float, object]:
    t = time.perf_counter()
    value = f()
    return time.perf_counter() - t, value


def measure(blocks: int, repeat: int) -> dict:
    """Time both ways on the per-block rewrite of a ``blocks``-block synthetic graph."""
    import onnx_remat
    from benchmarks.synthetic import training_artifacts
    from onnx_remat import collector
    from onnx_remat import compiled as native
    from onnx_remat.analysis.sizes import TensorSizes
    from onnx_remat.ortsim.emulation import emulate
    from onnx_remat.scheduling.orders import ListScheduler

    if not native.built():
        raise SystemExit("the compiled walks are not built (make setup builds them)")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = training_artifacts(blocks, Path(tmp) / "synthetic")
        rewrite = onnx_remat.apply(model_dir, scopes=["blocks.*"], schedule=False, check_peak=False).model
    g = emulate(rewrite, TensorSizes(rewrite))
    rg, order = g.rg, g.order
    rows: dict[str, dict[str, list[float]]] = {}

    def run(way: str) -> None:
        os.environ["ONNX_REMAT_NATIVE"] = "1" if way == "compiled" else "0"
        from onnx_remat.ortsim.planner import plan_memory

        # cold: nothing of the graph read yet, its sizes' memos included (a graph planned once)
        rg.sizes = g.sizes.copy(memos=False)
        rg.plan_tables = rg.plan_arrays = None
        cold, plan = _timed(lambda: plan_memory(rg, order))
        warm, again = _timed(lambda: plan_memory(rg, order))
        rg._order = None  # (the graph's kept order: asked anew)
        walk, ordered = _timed(rg.default_order)
        scheduler = ListScheduler(rg, order)
        freeing, by_freeing = _timed(lambda: scheduler.order("freeing"))
        greedy, by_greedy = _timed(lambda: scheduler.order("greedy"))
        for key, value in (
            ("plan, cold", cold),
            ("plan, warm", warm),
            ("DEFAULT order", walk),
            ("list schedule, freeing", freeing),
            ("list schedule, greedy", greedy),
        ):
            rows.setdefault(key, {}).setdefault(way, []).append(value)
        results[way] = (plan, again, (ordered, by_freeing, by_greedy))

    results: dict[str, tuple] = {}
    try:
        # as the commands run: the cyclic collector off (onnx_remat.collector)
        with collector.paused():
            _repeat(repeat, run, results)
    finally:
        os.environ.pop("ONNX_REMAT_NATIVE", None)
    live = sum(1 for n in rg.nodes if n is not None)
    return {
        "blocks": blocks,
        "nodes": live,
        "repeat": repeat,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "rows": {key: {way: statistics.median(times) for way, times in by_way.items()} for key, by_way in rows.items()},
    }


def _repeat(repeat: int, run: Callable[[str], None], results: dict[str, tuple]) -> None:
    """``run`` both ways, alternating, ``repeat`` times, each pair checked to agree."""
    for _ in range(repeat):
        for way in ("compiled", "python"):
            run(way)
        (p1, p2, o1), (q1, _, o2) = results["compiled"], results["python"]
        if not (dataclasses.asdict(p1) == dataclasses.asdict(q1) == dataclasses.asdict(p2)) or o1 != o2:
            raise SystemExit("the compiled and the Python walks disagree")


def render(result: dict) -> str:
    """The Markdown table of a :func:`measure` result."""
    lines = [
        f"Compiled walks against Python: the per-block rewrite of the {result['blocks']:,}-block synthetic "
        f"graph, emulated ({result['nodes']:,} nodes); median of {result['repeat']} runs each, alternating, "
        "one process, the cyclic collector off as in the commands (`python -m benchmarks.native_speed`).",
        "",
        "| step | Python | compiled | ratio |",
        "|---|---:|---:|---:|",
    ]
    for key, by_way in result["rows"].items():
        py, c = by_way["python"], by_way["compiled"]
        lines.append(f"| {key} | {py:.3f} s | {c:.3f} s | x{c / py:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=3850)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    result = measure(args.blocks, args.repeat)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    text = render(result)
    args.out.with_suffix(".md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
