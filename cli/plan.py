"""``onnx-remat plan``: what recompute a memory budget takes, and the trade-off curve (``--sweep``).

Also the ``--budget`` options and printing that ``onnx-remat apply`` shares.
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from onnx_remat.cli.common import (
    console,
    dims_from,
    dims_option,
    force_option,
    json_option,
    model_argument,
    outputs,
    print_notes,
    write_json,
)
from onnx_remat.errors import RematError, UsageError
from onnx_remat.units import format_bytes, format_bytes_apart

COST_CHOICES = ("auto", "profile", "flops")


def budget_options(f):
    """``--budget``, ``--profile`` and ``--cost`` (apply and plan)."""
    f = click.option(
        "--cost",
        type=click.Choice(COST_CHOICES),
        default="auto",
        show_default=True,
        help="Per-node compute costs: 'profile' measures onnxruntime's profile of MODEL once (a few steps) and "
        "caches it beside the model; 'flops' estimates them; 'auto' uses a cached profile when there is one, "
        "else the estimate.",
    )(f)
    f = click.option(
        "--profile",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        metavar="PROFILE.json",
        help="Per-node costs from this onnxruntime profile (enable_profiling) or onnx-remat cost profile.",
    )(f)
    return f


def budget_option(f):
    return click.option(
        "--budget",
        metavar="SIZE|PERCENT|min",
        help="Choose what to recompute so the planned peak fits SIZE (60MiB, 1.5GiB) or PERCENT of the "
        "unrewritten planned peak (40%), at the least added compute; 'min': the lowest planned peak "
        "onnx-remat reaches. Replaces --scope/--op-type/--node.",
    )(f)


def resolve_profile(model, cost: str, profile: Path | None):
    """What to pass as ``profile`` to the library for ``--cost`` / ``--profile``."""
    if profile is not None:
        if cost == "flops":
            raise UsageError("--profile gives measured costs; it cannot go with --cost flops")
        return profile
    if cost == "flops":
        from onnx_remat.remat.cost import FLOPS_SOURCE

        return FLOPS_SOURCE
    if cost == "profile":
        from onnx_remat.runtime.profile import profile_costs

        with console.status("profiling one training step with onnxruntime (cached beside the model)"):
            return profile_costs(model)
    return None


def print_budget(b, *, notes: bool = True) -> None:
    """A :class:`~onnx_remat.remat.budget.BudgetResult`: what each unit does, the estimated peak, the
    compute (and its notes, unless the caller prints them with its own)."""
    chosen = b.chosen
    peak = b.planned_peak
    scheduled = f", {format_bytes(chosen.peak)} unscheduled" if peak != chosen.peak else ""
    console.print(
        f"[bold]budget {format_bytes(b.budget)}[/]: estimated planned peak {format_bytes(peak)}{scheduled} "
        f"(unrewritten {format_bytes(b.baseline_peak)}, x{peak / b.baseline_peak:.2f}); added compute "
        f"{chosen.added:.1%} of a step; plan from {chosen.source}"
    )
    for line in chosen.choices:
        console.print(f"  {line}")
    if notes:
        print_notes(b.notes)


def budget_verdict(comparison, limit: int) -> tuple[bool, str]:
    """Whether the measured planned peak met the budget, and the line saying so."""
    measured = comparison.b.planned_peak_bytes
    if measured is None:
        return False, "budget not checked: onnxruntime reported no planned peak"
    ok = measured <= limit
    word = "met" if ok else "NOT met"
    shown, allowed = format_bytes_apart(measured, limit)
    return ok, f"budget {word}: measured planned peak {shown} {'<=' if ok else '>'} {allowed}"


@click.command("plan")
@model_argument
@click.option("--sweep", is_flag=True, help="The trade-off curve: peak against added compute, budget by budget.")
@click.option(
    "--budget",
    "budgets",
    multiple=True,
    metavar="SIZE|PERCENT",
    help="Plan for this budget (repeatable); with --sweep, these budgets instead of evenly spaced ones.",
)
@click.option(
    "--points", type=click.IntRange(min=2, max=64), default=8, show_default=True, help="Budgets of a --sweep."
)
@budget_options
@dims_option
@json_option
@click.option(
    "--plot",
    "plot_out",
    type=click.Path(path_type=Path),
    metavar="CURVE.png|CURVE.svg",
    help="Draw the curve (with --sweep): planned peak against added compute, per-layer and --recompute-outputs marked.",
)
@force_option
def command(model, sweep, budgets, points, cost, profile, dims, json_out, plot_out, force):
    """Plan recompute for memory budgets of MODEL; writes no model (see `apply --budget`).

    \b
    Examples:
      onnx-remat plan models/artifacts/blocks10 --budget 60MiB
      onnx-remat plan models/artifacts/blocks10 --sweep --plot curve.png
      onnx-remat plan training_model.onnx --sweep --budget 40% --budget 60% --json -
    """
    from onnx_remat.analysis.model import analyze_model
    from onnx_remat.remat.budget import BudgetPlanner, parse_budget

    if not sweep and not budgets:
        raise UsageError("give --budget SIZE|PERCENT or --sweep")
    if plot_out is not None and not sweep:
        raise UsageError("--plot draws the --sweep curve: add --sweep")
    if plot_out is not None and plot_out.suffix.lower() not in (".png", ".svg"):
        raise RematError(
            f"{plot_out}: cannot write a {plot_out.suffix or 'suffix-less'} plot; give a .png or .svg path"
        )
    with outputs({"MODEL": model, "--profile": profile}, force=force) as outs:
        outs.claim(json_out, "--json")
        outs.claim(plot_out, "--plot")
        analysis = analyze_model(model, dims=dims_from(dims))
        planner = BudgetPlanner(analysis, profile=resolve_profile(model, cost, profile), schedule=True)
        base = planner.baseline_peak
        limits = [parse_budget(b, base) for b in budgets]
        if not sweep:
            out = []
            for limit in limits:
                result = planner.plan(limit)
                print_budget(result)
                out.append(result.summary())
            write_json({"model": analysis.name, "plans": out}, json_out, force=force)
            return
        with console.status("planning the trade-off curve"):
            curve = planner.sweep(limits or None, points=points)
        print_sweep(analysis.name, curve)
        if plot_out is not None:
            from onnx_remat.show.tradeoff import plot_sweep

            console.print(f"wrote {plot_sweep(curve, plot_out, title=analysis.name, force=force)}")
        write_json({"model": analysis.name, **curve.to_json()}, json_out, force=force)


def print_sweep(name: str, curve) -> None:
    """The curve as a table: budget, estimated planned peak, added compute, what it is."""
    console.print(
        f"[bold]{name}[/]: unrewritten planned peak {format_bytes(curve.baseline_peak)}; costs from "
        f"{curve.cost_source}; lowest reachable {format_bytes(curve.floor.written_peak)}"
    )
    table = Table(show_edge=False, header_style="bold")
    for col, just in (("budget", "right"), ("planned peak", "right"), ("x", "right"), ("added compute", "right")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    table.add_column("plan", overflow="fold")
    base = curve.baseline_peak
    for p in curve.points:
        if p.plan is None:
            table.add_row(format_bytes(p.budget), "unreachable", "", "", "")
            continue
        what = p.plan.source if p.plan.source != "planner" else f"{len(p.plan.choices)} units/groups recomputed"
        table.add_row(
            format_bytes(p.budget),
            format_bytes(p.plan.written_peak),
            f"x{p.plan.written_peak / base:.2f}",
            f"{p.plan.added:.1%}",
            what,
        )
    for ref in curve.references:
        table.add_row(
            "-",
            format_bytes(ref.written_peak),
            f"x{ref.written_peak / base:.2f}",
            f"{ref.added:.1%}",
            f"reference: {ref.source}",
        )
    console.print(table)
