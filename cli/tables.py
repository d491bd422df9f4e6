"""Rich tables for measurements and comparisons, and a progress display for running workers.

Sizes in binary units (:func:`onnx_remat.units.format_bytes`), ratios as ``x0.33``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich import box
from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from onnx_remat.runtime.compare import Comparison
from onnx_remat.runtime.kept import RewriteCheck
from onnx_remat.runtime.measure import Measurement, ProgressEvent
from onnx_remat.runtime.prepared import FORWARD_ONLY_NOTE
from onnx_remat.units import format_bytes

_MEMORY_ROWS = (
    ("planned_peak_bytes", "planned peak", "memory-pattern block of a step"),
    ("arena_peak_bytes", "arena peak", "exact-growth arena, init included"),
    ("live_peak_bytes", "live peak", "RSS growth in a step, no arena"),
)


def _seconds(x: float | None) -> str:
    if x is None:
        return "?"
    return f"{x * 1000:.1f} ms" if x < 1 else f"{x:.3f} s"


def _ratio(r: float | None) -> Text:
    if r is None:
        return Text("?", style="dim")
    style = "green" if r < 0.995 else ("red" if r > 1.005 else "")
    return Text(f"x{r:.2f}", style=style)


def _flag(v: bool | None) -> Text:
    if v is None:
        return Text("?", style="dim")
    return Text("yes", style="green") if v else Text("NO", style="bold red")


def _title(m: Measurement) -> str:
    return (
        f"{m.model}  [dim]({m.device}, {m.steps} timed step{'s' if m.steps != 1 else ''} after "
        f"{m.warmup} warm-up, seed {m.seed}, onnxruntime {m.onnxruntime or '?'})[/dim]"
    )


def _step_time(m: Measurement) -> str:
    t = m.step_time_s
    if t.median is None:
        return "?"
    if len(t.samples) == 1:
        return _seconds(t.median)
    return f"{_seconds(t.median)} [dim]({_seconds(t.min)}, {_seconds(t.max)})[/dim]"


def measurement_table(m: Measurement) -> Table:
    """The figures of one measurement: peaks, step time, loss."""
    table = Table(title=_title(m), box=box.SIMPLE_HEAVY, title_justify="left", show_header=True)
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("what it is", style="dim")
    for key, label, what in _MEMORY_ROWS:
        table.add_row(label, format_bytes(getattr(m, key)), what)
    table.add_row("step time", _step_time(m), "median (min, max)")
    what = "first output (forward only)" if FORWARD_ONLY_NOTE in m.notes else "after one step"
    table.add_row("loss", f"{m.loss:.6g}" if m.loss is not None else "?", what)
    return table


def inputs_table(m: Measurement) -> Table:
    """How each data input (and synthesized parameter) was made."""
    table = Table(title="inputs", box=box.SIMPLE, title_justify="left")
    for col in ("input", "shape", "dtype", "values"):
        table.add_column(col, overflow="fold")
    ckpt = [n for n, i in m.inputs.items() if i.source == "checkpoint"]
    for name, info in m.inputs.items():
        if info.source == "checkpoint":
            continue
        values = info.source
        if info.int_range:
            values += f", integers in [{info.int_range[0]}, {info.int_range[1]})"
            if info.range_source:
                values += f" [dim]({info.range_source})[/dim]"
        table.add_row(name, "x".join(map(str, info.shape)) or "scalar", info.dtype, values)
    if ckpt:
        table.add_row(f"[dim]{len(ckpt)} parameters[/dim]", "", "", f"[dim]from {m.checkpoint}[/dim]")
    return table


def rewrite_table(check: RewriteCheck) -> Table | None:
    """Per segment: clones kept and run, barrier kept, clones after their trigger and after the forward pass.

    None when the graph has no onnx-remat nodes.
    """
    if not (check.clones_in_model or check.barriers_in_model):
        return None

    def kept(k, n):
        return f"{k if k is not None else '?'}/{n}"

    title = (
        f"recompute nodes kept by onnxruntime: clones {kept(check.clones_kept, check.clones_in_model)}, "
        f"barriers {kept(check.barriers_kept, check.barriers_in_model)}; "
        f"clones executed: {check.clones_ran if check.clones_ran is not None else '?'}"
    )
    table = Table(title=title, box=box.SIMPLE, title_justify="left")
    for col in ("segment", "clones kept", "ran", "barrier", "after trigger", "after forward"):
        table.add_column(col, justify="left" if col == "segment" else "right", overflow="fold")
    for s in check.segments:
        table.add_row(
            s.label,
            kept(s.clones_kept, s.clones),
            str(s.clones_ran),
            _flag(s.barrier_kept) if s.barrier else Text("none", style="yellow"),
            _flag(s.ran_after_trigger),
            _flag(s.ran_after_forward),
        )
    return table


def titled(table: Table) -> Group:
    """The table with its title as a line of its own above it: rich wraps a title to the table's
    width, which cut model paths and the run settings in two."""
    title = table.title
    table.title = None
    if title is None:
        return Group(table)
    return Group(Text.from_markup(title) if isinstance(title, str) else title, table)


def _notes(notes: list[str], prefix: str = "") -> list[Text]:
    return [Text(f"note: {prefix}{n}", style="yellow") for n in notes]


def render_measurement(m: Measurement, *, show_inputs: bool = True) -> Group:
    """Everything about one measurement, ready for ``console.print``."""
    parts: list = [titled(measurement_table(m))]
    if show_inputs and m.inputs:
        parts.append(titled(inputs_table(m)))
    rt = rewrite_table(m.rewrite)
    if rt is not None:
        parts.append(titled(rt))
    parts.extend(_notes(m.notes + m.rewrite.notes))
    return Group(*parts)


def comparison_table(c: Comparison) -> Table:
    """A and B side by side with B/A ratios."""
    table = Table(
        title=f"A: {c.a.model}\nB: {c.b.model}  [dim]({c.a.device}, {c.a.steps} timed steps after "
        f"{c.a.warmup} warm-up, seed {c.a.seed})[/dim]",
        box=box.SIMPLE_HEAVY,
        title_justify="left",
    )
    table.add_column("measure")
    table.add_column("A", justify="right")
    table.add_column("B", justify="right")
    table.add_column("B/A", justify="right")
    for key, label, _ in _MEMORY_ROWS:
        table.add_row(
            label, format_bytes(getattr(c.a, key)), format_bytes(getattr(c.b, key)), _ratio(c.ratios.get(key))
        )
    table.add_row(
        "step time (median)",
        _seconds(c.a.step_time_s.median),
        _seconds(c.b.step_time_s.median),
        _ratio(c.ratios.get("step_time_s")),
    )
    table.add_row(
        "loss",
        f"{c.a.loss:.6g}" if c.a.loss is not None else "?",
        f"{c.b.loss:.6g}" if c.b.loss is not None else "?",
        "",
    )
    return table


def differences_table(c: Comparison, limit: int = 20) -> Table | None:
    """Outputs that differ, with their largest absolute difference (None when all are equal)."""
    names = c.mismatched + c.only_in_a + c.only_in_b
    if not names:
        return None
    table = Table(title="outputs that differ", box=box.SIMPLE, title_justify="left")
    table.add_column("output", overflow="fold")
    table.add_column("max |B - A|", justify="right")
    for name in names[:limit]:
        if name in c.only_in_a:
            value = "only in A"
        elif name in c.only_in_b:
            value = "only in B"
        else:
            d = c.max_abs_diff.get(name)
            value = "shapes differ" if d is None else f"{d:.3g}"
        table.add_row(name, value)
    if len(names) > limit:
        table.add_row(f"[dim]... and {len(names) - limit} more[/dim]", "")
    return table


def verdict(c: Comparison) -> Text:
    """The closing PASSED/FAILED line."""
    n = len(c.max_abs_diff)
    how = "bit-identical" if c.atol == 0 and c.rtol == 0 else f"within atol={c.atol:g}, rtol={c.rtol:g}"
    if c.by_design is not None and c.mask_check is not None:
        return _seeded_verdict(c, n, how)
    if c.equal:
        grads = sum(k.endswith("_grad") for k in list(c.max_abs_diff)[1:])
        others = n - 1 - grads
        what = f"loss and {grads} gradient{'s' if grads != 1 else ''}" + (
            f" and {others} other outputs" if others else ""
        )
        run = "one single-threaded step" if c.equality_run == "single_thread" else "one step"
        return Text(f"PASSED: {what} {how} ({run}, seed {c.a.seed})", style="bold green")
    diffs = [d for d in c.max_abs_diff.values() if d is not None]
    worst = f", largest difference {max(diffs):.3g}" if diffs else ""
    bad = len(c.mismatched) + len(c.only_in_a) + len(c.only_in_b)
    return Text(f"FAILED: {bad} of {n} outputs not {how}{worst}", style="bold red")


def _seeded_verdict(c: Comparison, n: int, how: str) -> Text:
    """The verdict on a dropout=seed rewrite: checked against A with B's seeds, and redraw by redraw."""
    m = c.mask_check
    assert m is not None
    grads = sum(k.endswith("_grad") for k in list(c.max_abs_diff)[1:])
    same = c.equal or (not c.mismatched and not c.only_in_a and not c.only_in_b)
    outputs = (
        f"loss and {grads} gradients {how} to {c.reference}"
        if same
        else f"{len(c.mismatched) + len(c.only_in_a) + len(c.only_in_b)} of {n} outputs not {how} to {c.reference}"
    )
    masks = (
        f"recomputed dropout masks equal to the forward ones in {m.steps} steps ({m.pairs} pairs)"
        if m.equal
        else f"{len(m.mismatched)} recomputed masks or outputs differ from the forward ones "
        f"(first: step {m.mismatched[0]['step']}, {m.mismatched[0]['by']})"
        if m.mismatched
        else "no recomputed dropout mask to check"
    )
    word, style = ("PASSED", "bold green") if c.equal else ("FAILED", "bold red")
    return Text(f"{word}: {c.by_design}; {outputs}; {masks}", style=style)


def render_comparison(c: Comparison, *, with_verdict: bool = True) -> Group:
    """Everything about a comparison, verdict last (print that one with ``soft_wrap=True``, see
    :func:`print_comparison`, so a narrow terminal does not break the PASSED/FAILED line)."""
    parts: list = [titled(comparison_table(c))]
    for tag, m in (("A", c.a), ("B", c.b)):
        rt = rewrite_table(m.rewrite)
        if rt is not None:
            rt.title = f"{tag}: {rt.title}"
            parts.append(titled(rt))
    parts.extend(_notes(c.a.notes + c.a.rewrite.notes, "A: "))
    parts.extend(_notes(c.b.notes + c.b.rewrite.notes, "B: "))
    dt = differences_table(c)
    if dt is not None:
        parts.append(titled(dt))
    if with_verdict:
        parts.append(verdict(c))
    return Group(*parts)


def print_comparison(console: Console, c: Comparison) -> None:
    """Print a comparison with its PASSED/FAILED verdict on one unwrapped last line."""
    console.print(render_comparison(c, with_verdict=False))
    console.print(verdict(c), soft_wrap=True)


_CONFIG_WORDS = {"arena": "planned/arena peak, step time", "live": "live peak", "outputs": "outputs, one thread"}


def progress_lines(write) -> Callable[[ProgressEvent], None]:
    """A :class:`ProgressEvent` callback for logs and pipes: one line per phase of each worker
    (session, warm-up, timed steps), passed to ``write``."""
    phase_of: dict[tuple[str, str], str] = {}

    def on_event(ev: ProgressEvent) -> None:
        key = (ev.tag, ev.config)
        label = f"{ev.tag + ': ' if ev.tag else ''}{_CONFIG_WORDS.get(ev.config, ev.config)}"
        if ev.phase == "session":
            phase_of[key] = ev.phase
            write(f"{label}: starting onnxruntime")
            return
        took = f", {_seconds(ev.seconds)}" if ev.seconds is not None else ""
        if phase_of.get(key) != ev.phase:
            phase_of[key] = ev.phase
            what = "warm-up" if ev.phase == "warmup" else "timed steps"
            write(f"{label}: {what} (step {ev.index}/{ev.total}{took})")
        if ev.index == ev.total:
            write(f"{label}: done ({ev.total} step{'s' if ev.total != 1 else ''})")

    return on_event


@contextmanager
def progress_display(console: Console, log: Console | None = None) -> Iterator:
    """Yields a callback for :class:`ProgressEvent`: a rich progress display on a terminal, else
    one line per phase on ``log`` (standard error by default), so CI logs and pipes show that
    something is happening during the 15-30 s a comparison takes."""
    if not console.is_terminal:
        log = log or Console(stderr=True, highlight=False, soft_wrap=True)

        def write(line: str) -> None:
            log.print(f"[{time.strftime('%H:%M:%S')}] {line}", markup=False)

        yield progress_lines(write)
        return
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("[dim]{task.fields[last]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    tasks: dict[tuple[str, str], int] = {}
    config_words = _CONFIG_WORDS

    def on_event(ev: ProgressEvent) -> None:
        key = (ev.tag, ev.config)
        label = f"{ev.tag + ': ' if ev.tag else ''}{config_words.get(ev.config, ev.config)}"
        if key not in tasks:
            tasks[key] = progress.add_task(label, total=None, last="starting onnxruntime")
        if ev.phase == "session":
            progress.update(tasks[key], last="building the session")
            return
        last = f"{ev.phase} {ev.index}/{ev.total}" + (f" {_seconds(ev.seconds)}" if ev.seconds is not None else "")
        progress.update(tasks[key], total=ev.total, completed=ev.index, last=last)

    with progress:
        yield on_event
