"""Real size: onnx-remat on the models that run out of memory, beside PyTorch's own answers, in one run.

    python -m benchmarks.realsize [NAME ...] [--steps 2] [--peers eager,checkpoint,sac,compile]
    python -m benchmarks.realsize --render [--readme]   # the Markdown (and README's tables) from the JSON
    python -m benchmarks.realsize NAME --append --resume   # only the peers an earlier run missed
    python -m benchmarks.realsize --tool-only       # every recorded apply again: its time and RSS only

For each model of ``models.realsize.REALSIZE`` (default: all, smallest first; artifacts exported
into ``.cache/realsize`` when missing), every figure from this one run:

onnx-remat, each ``onnx-remat apply`` a fresh process (its wall time and peak RSS recorded):

* ``per-layer``: ``apply ART --scope <layer class>`` with the defaults;
* ``budget 50%``: ``apply ART --budget 50%``;
* ``lowest``: ``apply ART --budget min``, the lowest exact planned peak the planner finds.

Each rewrite against the original by :func:`onnx_remat.compare` (planned peak, live peak, step
time side by side, loss and every gradient after one step, single-threaded where kernels race),
and the absolute step peak of both (:func:`onnx_remat.runtime.step_peak.absolute_step_peak`:
``Module`` + AdamW ``Optimizer``, parameters, gradients, moments and activations).

PyTorch on the same module, inputs and loss (:mod:`benchmarks.peer_step`, a fresh process per
configuration): eager, ``torch.utils.checkpoint`` per layer, selective checkpointing (matrix
products saved), and ``torch.compile`` with ``activation_memory_budget`` 1.0, 0.5 and the budget
whose live peak comes closest to onnx-remat's lowest exact live peak (a few probes). Time ratios
are to each runtime's own baseline: onnxruntime's original graph for onnx-remat, eager for
eager/checkpoint/selective, ``compile`` at 1.0 for the compile rows.

Results: ``benchmarks/results/realsize.json`` (every figure; written after each model, so a run
cut short keeps what it measured) and ``realsize.md`` (one table per model).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "realsize"
ORDER = (  # cheapest first
    "resnet50",
    "vit_b16",
    "vit_b16_dynamo",
    "bert_base",
    "bert_base_dynamo",
    "gpt2_small",
    "gpt2_small_dynamo",
    "gpt2_medium",
    "llama_2048",
)
REMAT_CONFIGS = (("per-layer", None), ("budget 50%", "50%"), ("lowest", "min"))
PEERS = ("eager", "checkpoint", "sac", "compile")
MATCH_PROBES = (0.25, 0.1, 0.5)  # compile:match: the budgets tried, in order, until one is at or below the target
MiB = 2**20


def same_module(name: str) -> str | None:
    """The model whose PyTorch module ``name``'s graph comes from when it is another exporter's
    graph of it (``<model>_dynamo``): the peers are measured once, on that one."""
    from models.realsize import DYNAMO_TOO

    base = name.removesuffix("_dynamo")
    return base if base != name and base in DYNAMO_TOO else None


def _rewrite_dir(work: Path, label: str) -> Path:
    """Where configuration ``label``'s rewrite is written under ``work``."""
    return work / label.replace(" ", "_").replace("%", "pc")


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def tool_run(argv: list[str], timeout: float) -> dict:
    """``argv`` as a fresh process: wall seconds, peak RSS (bytes), exit status, last stderr line."""
    from benchmarks.apply_scale import run_measured

    return run_measured(argv, timeout)


def apply_config(cli: Path, art: Path, spec, label: str, budget: str | None, out: Path, timeout: float) -> dict:
    """Run one onnx-remat configuration; returns its tool figures and the estimate it printed."""
    args = ["--scope", spec.block_scope] if budget is None else ["--budget", budget]
    js = out.with_suffix(".json")
    argv = [str(cli), "apply", str(art), *args, "-o", str(out), "--force", "--json", str(js)]
    row: dict = {"config": label, "command": f"onnx-remat apply ART {' '.join(args)}", "tool": tool_run(argv, timeout)}
    if js.exists():
        summary = json.loads(js.read_text())
        est = summary.get("estimate") or {}
        row["estimate_before"] = est.get("planned_peak_bytes_before")
        row["estimate_after"] = est.get("planned_peak_bytes_after")
        row["segments"] = len(summary.get("segments") or [])
    return row


def refresh_tool_figures(data: dict, cache: Path, timeout: float) -> list[str]:
    """``--tool-only``: run every recorded onnx-remat configuration's ``apply`` again, as a fresh
    process, and replace only its tool figures (wall time, peak RSS): after a change to the tool
    that leaves its output alone, or to measure all models' tool figures side by side. A rewrite
    whose estimate or segment count differs from the recorded one is reported (the returned lines)
    and its figures are not replaced: the rest of that row would no longer describe it."""
    from benchmarks.peer_step import find_spec

    cli = Path(sys.executable).with_name("onnx-remat")
    budgets = dict(REMAT_CONFIGS)
    problems = []
    for report in data["models"]:
        spec = find_spec(report["model"])
        art, _ = ensure_artifacts(spec, cache)
        work = Path(tempfile.mkdtemp(prefix=f"realsize-tool-{spec.name}-"))
        try:
            for row in report["rows"]:
                if row["config"] not in budgets or row.get("error"):
                    continue
                _log(f"{spec.name}: onnx-remat {row['config']} (tool figures)")
                out = _rewrite_dir(work, row["config"])
                again = apply_config(cli, art, spec, row["config"], budgets[row["config"]], out, timeout)
                shutil.rmtree(out, ignore_errors=True)
                same = all(again.get(k) == row.get(k) for k in ("estimate_before", "estimate_after", "segments"))
                if again["tool"]["exit"] != 0 or not same:
                    problems.append(
                        f"{spec.name} {row['config']}: exit {again['tool']['exit']}, estimate "
                        f"{again.get('estimate_after')} (recorded {row.get('estimate_after')}), segments "
                        f"{again.get('segments')} (recorded {row.get('segments')})"
                    )
                    continue
                row["tool"] = again["tool"]
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return problems


def feeds_of(spec) -> list:
    """The training graph's inputs, in its order: the model inputs, then the loss target."""
    arrays = [t.numpy() for t in spec.example_inputs()]
    target = spec.example_target()
    return arrays + ([target.numpy()] if target is not None else [])


def measure_rewrite(art: Path, out: Path, spec, steps: int) -> dict:
    """compare(original, rewrite) and both absolute step peaks."""
    from onnx_remat.runtime.compare import compare
    from onnx_remat.runtime.step_peak import absolute_step_peak

    c = compare(art, out, steps=steps, warmup=1, live=True)
    a, b = c.a, c.b
    return {
        "planned_before": a.planned_peak_bytes,
        "planned_after": b.planned_peak_bytes,
        "live_before": a.live_peak_bytes,
        "live_after": b.live_peak_bytes,
        "time_before_s": a.step_time_s.median,
        "time_after_s": b.step_time_s.median,
        "time_ratio": c.ratios.get("step_time_s"),
        "equal": c.equal,
        "equality_run": c.equality_run,
        "mismatched": c.mismatched[:5],
        "absolute_before": absolute_step_peak(art, feeds_of(spec))["absolute_peak_bytes"],
        "absolute_after": absolute_step_peak(out, feeds_of(spec))["absolute_peak_bytes"],
    }


def peer_run(name: str, config: str, steps: int, timeout: float) -> dict:
    """One PyTorch configuration in a fresh process (benchmarks.peer_step)."""
    from onnx_remat.runtime.memory import LIVE_MALLOC_ENV

    argv = [sys.executable, "-m", "benchmarks.peer_step", "--model", name, "--config", config, "--steps", str(steps)]
    env = {**os.environ, **LIVE_MALLOC_ENV}
    start = time.perf_counter()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"config": config, "error": f"took more than {timeout:.0f} s (compilation included)"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = " ".join(proc.stderr.strip()[-400:].split()) or f"exit {proc.returncode}"
        return {"config": config, "error": tail}
    data = json.loads(lines[-1])
    if "error" in data:
        return {"config": config, "error": data["error"]}
    return {**data["result"], "config": config, "error": None, "wall_s": time.perf_counter() - start}


def measure_peers(
    name: str, peers: list[str], steps: int, target_live: int | None, timeout: float, kept: list[dict] | None = None
) -> list[dict]:
    """The PyTorch rows: eager, checkpoint, selective, compile at 1.0, 0.5 and matched to ``target_live``.

    ``kept``: rows of an earlier run of this model (``--resume``); a configuration among them that
    ran without error is kept as it is, and only the others are measured."""
    done = {r["config"]: r for r in kept or [] if not r.get("error")}

    def run(config: str, what: str) -> dict:
        if config in done:
            _log(f"{name}: PyTorch {what}: kept from the earlier run")
            return done[config]
        _log(f"{name}: PyTorch {what}")
        return peer_run(name, config, steps, timeout)

    rows = [run(config, config) for config in peers if config != "compile"]
    if "compile" in peers:
        for budget in (1.0, 0.5):
            rows.append(run(f"compile:{budget}", f"compile, activation_memory_budget {budget}"))
        rows += (
            [done["compile:match"]]
            if "compile:match" in done
            else match_compile(name, rows, steps, target_live, timeout)
        )
    return rows


def match_compile(name: str, rows: list[dict], steps: int, target_live: int | None, timeout: float) -> list[dict]:
    """``compile:match``: the probe of :data:`MATCH_PROBES` whose live peak is closest to ``target_live``
    (stopping at the first at or below it), with 1.0 and 0.5 counted as probes too."""
    if target_live is None:
        return [{"config": "compile:match", "error": "no exact onnx-remat live peak to match"}]
    probes = [r for r in rows if r["config"].startswith("compile:") and not r.get("error")]
    for budget in MATCH_PROBES:
        if any(r.get("live_peak_bytes") is not None and r["live_peak_bytes"] <= target_live for r in probes):
            break
        if any(r.get("budget") == budget for r in probes):
            continue
        _log(f"{name}: PyTorch compile, activation_memory_budget {budget} (matching {target_live / MiB:.0f} MiB)")
        r = peer_run(name, f"compile:{budget}", steps, timeout)
        if r.get("error"):
            return [{**r, "config": "compile:match"}]
        probes.append(r)
    if not probes:
        return [{"config": "compile:match", "error": "no compile configuration ran"}]
    best = min(probes, key=lambda r: abs((r.get("live_peak_bytes") or 0) - target_live))
    return [
        {**best, "config": "compile:match", "probes": [(r.get("budget"), r.get("live_peak_bytes")) for r in probes]}
    ]


def ensure_artifacts(spec, cache: Path) -> tuple[Path, float | None]:
    """The artifacts of ``spec`` under ``cache`` (exported when missing) and the export's seconds."""
    from models.export import export_artifacts

    art = cache / spec.name
    if (art / "training_model.onnx").exists():
        return art, None
    start = time.perf_counter()
    export_artifacts(spec, cache)
    return art, time.perf_counter() - start


def measure_model(
    name: str,
    *,
    steps: int,
    peers: list[str],
    cache: Path,
    timeout: float,
    keep: dict | None = None,
    resume: bool = False,
) -> dict:
    """Every figure of one real-size model (see the module docstring); with ``keep`` (this model's
    report from an earlier run), its onnx-remat rows are kept and only the peers measured again
    (with ``resume``, only the peers that did not run: see :func:`measure_peers`)."""
    import onnx

    from benchmarks.peer_step import find_spec

    spec = find_spec(name)
    art, export_s = ensure_artifacts(spec, cache)
    nodes = len(onnx.load(str(art / "training_model.onnx"), load_external_data=False).graph.node)
    cli = Path(sys.executable).with_name("onnx-remat")
    report: dict = {"model": name, "description": spec.description, "nodes": nodes, "export_s": export_s, "rows": []}
    if keep is not None:
        report["rows"] = keep["rows"]
    work = Path(tempfile.mkdtemp(prefix=f"realsize-{name}-"))
    try:
        for label, budget in REMAT_CONFIGS if keep is None else ():
            _log(f"{name}: onnx-remat {label}")
            out = _rewrite_dir(work, label)
            row = apply_config(cli, art, spec, label, budget, out, timeout)
            if row["tool"]["exit"] == 0 and out.exists():
                row.update(measure_rewrite(art, out, spec, steps))
            else:
                row["error"] = row["tool"].get("error") or f"exit {row['tool']['exit']}"
            report["rows"].append(row)
            shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    exact = [r["live_after"] for r in report["rows"] if r.get("equal") and r.get("live_after")]
    target = min(exact) if exact else None
    kept_peers = keep.get("peers") if keep is not None and resume else None
    twin = same_module(name)
    if twin:  # PyTorch runs the module, not the graph: its peers are measured once
        report["peers"], report["peers_of"] = [], twin
    else:
        report["peers"] = measure_peers(name, peers, steps, target, timeout, kept_peers) if peers else []
    return report


# -- the tables --------------------------------------------------------------------------------------


def _mib(n) -> str:
    if n is None:
        return "-"
    return f"{n / MiB:,.1f} MiB" if n < 100 * MiB else f"{n / MiB:,.0f} MiB"


def _x(r) -> str:
    return "-" if r is None else f"x{r:.2f}"


def _tool(t: dict | None) -> str:
    if not t:
        return "-"
    return f"{t['wall_s']:.1f} s, {t['peak_rss_bytes'] / 2**30:.2f} GiB"


def _estimate(row: dict) -> str:
    est, measured = row.get("estimate_after"), row.get("planned_after")
    if est is None or not measured:
        return "-"
    off = est / measured - 1
    return "exact" if est == measured else f"{off:+.1%}"


def render_model(report: dict) -> str:
    """One model's table: onnxruntime's original, onnx-remat's rows, then PyTorch's."""
    rows = report["rows"]
    first = next((r for r in rows if r.get("planned_before")), {})
    head = (
        "| configuration | planned peak | live peak | absolute step peak | time ratio | bit-identical "
        "| tool time, RSS | estimate vs planned |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---|---|---|"]
    lines.append(
        f"| onnxruntime, original | {_mib(first.get('planned_before'))} | {_mib(first.get('live_before'))} "
        f"| {_mib(first.get('absolute_before'))} | x1.00 | - | - | - |"
    )
    for r in rows:
        if r.get("error"):
            lines.append(f"| onnx-remat {r['config']} | {r['error']} ||||||")
            continue
        equal = "yes" if r.get("equal") else f"**no** ({', '.join(r.get('mismatched') or [])})"
        lines.append(
            f"| onnx-remat {r['config']} (`{r['command'].replace('onnx-remat apply ART ', '')}`) "
            f"| {_mib(r.get('planned_after'))} | {_mib(r.get('live_after'))} | {_mib(r.get('absolute_after'))} "
            f"| {_x(r.get('time_ratio'))} | {equal} | {_tool(r.get('tool'))} | {_estimate(r)} |"
        )
    peers = report.get("peers") or []
    if report.get("peers_of"):
        lines.append(f"| PyTorch | the same module as {report['peers_of']}: its rows there ||||||")
    base = {
        "eager": next((p for p in peers if p["config"] == "eager" and not p.get("error")), None),
        "compile": next((p for p in peers if p["config"] == "compile:1.0" and not p.get("error")), None),
    }
    for p in peers:
        label = _peer_label(p)
        if p.get("error"):
            lines.append(f"| {label} | cannot run here: {p['error']} ||||||")
            continue
        ref = base["compile" if p["config"].startswith("compile") else "eager"]
        ratio = p["step_time_s"] / ref["step_time_s"] if ref and ref.get("step_time_s") else None
        lines.append(
            f"| {label} | - | {_mib(p.get('live_peak_bytes'))} | {_mib(p.get('absolute_peak_bytes'))} "
            f"| {_x(ratio)} | - | - | - |"
        )
    return "\n".join(lines)


def _peer_label(p: dict) -> str:
    c = p["config"]
    if c == "eager":
        return "PyTorch eager"
    if c == "checkpoint":
        return "PyTorch `checkpoint` per layer"
    if c == "sac":
        return "PyTorch selective checkpointing (matmuls saved)"
    if c == "compile:match":
        b = p.get("budget")
        return f"PyTorch `torch.compile`, budget matched ({b})" if b is not None else "PyTorch `torch.compile`, matched"
    return f"PyTorch `torch.compile`, `activation_memory_budget` {c.split(':', 1)[1]}"


def summary_row(report: dict, peers_from: dict | None = None) -> dict:
    """One model's headline figures: onnx-remat's lowest exact live peak and its time ratio, and
    torch.compile's lowest live peak over the budgets measured, with its time ratio (the peers of
    ``peers_from``, the report of the same module's other graph, where given)."""
    exact = [r for r in report["rows"] if r.get("equal") and r.get("live_after")]
    ours = min(exact, key=lambda r: r["live_after"]) if exact else None
    peers = [p for p in (peers_from or report).get("peers") or [] if not p.get("error")]
    compile_base = next((p for p in peers if p["config"] == "compile:1.0"), None)
    compiled = [p for p in peers if p["config"].startswith("compile:") and p.get("live_peak_bytes")]
    best = min(compiled, key=lambda p: p["live_peak_bytes"]) if compiled else None
    eager = next((p for p in peers if p["config"] == "eager"), None)
    ckpt = next((p for p in peers if p["config"] == "checkpoint"), None)

    def ratio(p, base):
        return p["step_time_s"] / base["step_time_s"] if p and base and base.get("step_time_s") else None

    return {
        "model": report["model"],
        "original_live": (report["rows"][0] if report["rows"] else {}).get("live_before"),
        "ours": ours,
        "eager_live": eager.get("live_peak_bytes") if eager else None,
        "checkpoint": ckpt,
        "checkpoint_ratio": ratio(ckpt, eager),
        "compile_best": best,
        "compile_ratio": ratio(best, compile_base),
    }


def render_summary(data: dict) -> str:
    """The headline table: per model, onnx-remat's lowest exact live peak beside PyTorch's."""
    lines = [
        "| model | onnxruntime live peak | onnx-remat lowest exact: live peak, time | PyTorch eager live peak "
        "| `checkpoint` per layer: live peak, time | `torch.compile` lowest over budgets: live peak, time "
        "| onnx-remat's peak at or below compile's |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    by_name = {m["model"]: m for m in data["models"]}
    for report in data["models"]:
        s = summary_row(report, by_name.get(report.get("peers_of") or ""))
        ours, best, ck = s["ours"], s["compile_best"], s["checkpoint"]
        ours_cell = f"{_mib(ours['live_after'])}, {_x(ours.get('time_ratio'))} ({ours['config']})" if ours else "-"
        ck_cell = f"{_mib(ck.get('live_peak_bytes'))}, {_x(s['checkpoint_ratio'])}" if ck else "-"
        best_cell = (
            f"{_mib(best['live_peak_bytes'])}, {_x(s['compile_ratio'])} (budget {best.get('budget')})" if best else "-"
        )
        verdict = "-"
        if ours and best:
            verdict = "yes" if ours["live_after"] <= best["live_peak_bytes"] else "**no**"
        lines.append(
            f"| {s['model']} | {_mib(s['original_live'])} | {ours_cell} | {_mib(s['eager_live'])} | {ck_cell} "
            f"| {best_cell} | {verdict} |"
        )
    return "\n".join(lines)


def render(data: dict) -> str:
    """The Markdown of a whole run: a heading, description and table per model."""
    parts = []
    for report in data["models"]:
        absolute = [r.get("absolute_after") for r in report["rows"] if r.get("equal") and r.get("absolute_after")]
        parts.append(
            f"#### {report['model']}\n\n{report['description']}; {report['nodes']:,} training-graph nodes.\n\n"
            + render_model(report)
            + (f"\n\nLowest exact absolute step peak: {_mib(min(absolute))}." if absolute else "")
        )
    return "\n\n".join(parts)


README_START = "| model | onnxruntime live peak |"
README_END = "**What this shows.**"


def splice_readme(data: dict, readme: Path) -> None:
    """Rewrite README's "Real size" tables (the summary, then one section per model) from ``data``;
    the prose around them is left as it is."""
    text = readme.read_text()
    start, end = text.index(README_START), text.index(README_END)
    tables = render_summary(data) + "\n\n" + render(data).replace("#### ", "### ") + "\n\n"
    readme.write_text(text[:start] + tables + text[end:])


def _write(data: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    out.with_suffix(".md").write_text(
        f"# Real size: onnx-remat beside PyTorch\n\nRecorded {data['date']} ({data['machine']}), by "
        f"`{data['command']}`."
        + (f" Tool time and RSS measured again: {data['tool_figures']}." if data.get("tool_figures") else "")
        + f"\n\n{render(data)}\n"
    )


def main(argv: list[str] | None = None) -> int:
    from benchmarks.peer_step import find_spec
    from models.export import REALSIZE_OUT

    parser = argparse.ArgumentParser(prog="python -m benchmarks.realsize", description=__doc__.split("\n")[0])
    parser.add_argument(
        "names", nargs="*", help=f"models (default: {' '.join(ORDER)}; also any corpus or example model)"
    )
    parser.add_argument("--steps", type=int, default=2, help="timed steps per measurement (default 2)")
    parser.add_argument(
        "--peers", default=",".join(PEERS), help="PyTorch configurations: any of eager,checkpoint,sac,compile; '' none"
    )
    parser.add_argument("--cache", type=Path, default=REALSIZE_OUT, help="where the artifacts are kept")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per command (default 3600)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="<out>.json and <out>.md")
    parser.add_argument("--append", action="store_true", help="add to the models already in <out>.json")
    parser.add_argument("--render", action="store_true", help="rewrite <out>.md from <out>.json, run nothing")
    parser.add_argument("--readme", action="store_true", help="with --render: README's Real size tables too")
    parser.add_argument(
        "--peers-only", action="store_true", help="with --append: keep the onnx-remat rows, measure the peers again"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="with --append: keep the onnx-remat rows and every peer that ran; measure only the peers missing",
    )
    parser.add_argument(
        "--tool-only",
        action="store_true",
        help="run every recorded configuration's apply again and replace only its tool time and RSS",
    )
    args = parser.parse_args(argv)
    if args.tool_only:
        data = json.loads(args.out.with_suffix(".json").read_text())
        problems = refresh_tool_figures(data, args.cache, args.timeout)
        data["tool_figures"] = (
            f"{time.strftime('%Y-%m-%d')}, `python -m benchmarks.realsize --tool-only` "
            f"(load {os.getloadavg()[0]:.1f} at the end)"
        )
        _write(data, args.out)
        for line in problems:
            print(f"not replaced: {line}", file=sys.stderr)
        return 1 if problems else 0
    if (args.peers_only or args.resume) and not args.append:
        parser.error("--peers-only and --resume add to an earlier run: give --append")
    if args.render:
        data = json.loads(args.out.with_suffix(".json").read_text())
        _write(data, args.out)
        if args.readme:
            splice_readme(data, ROOT / "README.md")
        return 0
    names = args.names or list(ORDER)
    unknown = []
    for n in names:
        try:
            find_spec(n)
        except KeyError:
            unknown.append(n)
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; real size: {', '.join(ORDER)}")
    peers = [p for p in args.peers.split(",") if p]
    bad = [p for p in peers if p not in PEERS]
    if bad:
        parser.error(f"unknown peer(s) {', '.join(bad)}; known: {', '.join(PEERS)}")
    data = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "command": "python -m benchmarks.realsize " + " ".join(argv if argv is not None else sys.argv[1:]),
        "models": [],
    }
    if args.append and args.out.with_suffix(".json").exists():
        before = json.loads(args.out.with_suffix(".json").read_text())
        data["models"] = before["models"]
        data["command"] = f"{before['command']}, then {data['command']}"
    for name in names:
        again = args.peers_only or args.resume
        kept = next((m for m in data["models"] if m["model"] == name), None) if again else None
        names_before = [m["model"] for m in data["models"]]
        report = measure_model(
            name, steps=args.steps, peers=peers, cache=args.cache, timeout=args.timeout, keep=kept, resume=args.resume
        )
        if name in names_before:  # measured again: keep its place
            data["models"][names_before.index(name)] = report
        else:
            data["models"].append(report)
        _write(data, args.out)
        _log(f"{name}: done")
    print(render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
