"""Where one command's wall time goes: each pipeline stage's start, end and process, from one run.

    python -m benchmarks.stage_times -- apply MODEL --scope 'blocks.*' -o OUT --force -q
    python -m benchmarks.stage_times --json stages.json -- estimate MODEL --scope 'blocks.*'

The ``onnx-remat`` command after ``--`` runs in this process, as the console script runs it,
with the stages below wrapped so that each call writes one record (process, stage, start, end) to a
shared file: the forked children a large graph's command starts (:mod:`onnx_remat.forked`: the
original's emulation, the rewrite, the schedule's check of its best order) write theirs too, so
the table shows which stages run side by side and how long the command waits for a child
(``Forked.result``). The output's validity check runs in a fresh interpreter
(:mod:`onnx_remat.ortsim.check_process`) and is not traced. Times are ``time.perf_counter``
(CLOCK_MONOTONIC on Linux, one clock for every process), in seconds from this process's start.

cProfile sees one process and py-spy's sampling of forked children distorts what it samples
(seen: ``os.fork`` 0.6 s under py-spy, 0.015 s without); this says where the critical path goes,
stage by stage, at the cost of a dozen wrapped calls.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

T0 = time.perf_counter()

# (module, qualified name) of every stage traced: the pipeline of README "Layout", top to bottom.
STAGES: tuple[tuple[str, str], ...] = (
    ("onnx_remat.analysis.model", "analyze_model"),
    ("onnx_remat.remat.plan", "Planner.plan"),
    ("onnx_remat.remat.pipeline", "emulate_original"),
    ("onnx_remat.remat.rewrite", "RecomputeRewrite.call"),
    ("onnx_remat.graph.bridge", "ModelGraph.to_model"),
    ("onnx_remat.remat.rewrite", "RecomputeRewrite.ensures"),
    ("onnx_remat.scheduling.schedule", "order_rewrite"),
    ("onnx_remat.ortsim.emulation", "emulate_rewrite"),
    ("onnx_remat.ortsim.emulation", "emulate"),
    ("onnx_remat.scheduling.schedule", "MemorySchedule.__call__"),
    ("onnx_remat.memory", "estimate_emulated"),
    ("onnx_remat.scheduling.schedule", "check_scheduled"),
    ("onnx_remat.remat.result", "ApplyResult.save"),
    ("onnx_remat.forked", "Forked.result"),
)


@dataclass
class StageCall:
    """One traced call: the process it ran in, the stage, and its start and end (seconds)."""

    pid: int
    stage: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def _traced(func, qualname: str, records: str):
    @functools.wraps(func)
    def call(*args, **kwargs):
        start = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            end = time.perf_counter()
            line = json.dumps([os.getpid(), qualname, start - T0, end - T0]) + "\n"
            # One write of one short line to a file opened for appending: records of processes
            # writing at once do not interleave.
            fd = os.open(records, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)

    return call


def trace_stages(records: str) -> list[tuple[object, str, object]]:
    """Wrap every stage of :data:`STAGES`, where it is defined and where a module imported it by
    name, so that each call appends its record to the file ``records``. Returns what was replaced,
    (owner, name, original), for :func:`untrace`."""
    replaced: list[tuple[object, str, object]] = []
    for module_name, qualname in STAGES:
        owner = importlib.import_module(module_name)
        *path, name = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = getattr(owner, name)
        wrapped = _traced(original, qualname, records)
        # (a class's own attribute, not the function: a staticmethod or classmethod stays one)
        replaced.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, wrapped)
        if not path:  # a function: the modules that imported it by name hold it too
            for module in list(sys.modules.values()):
                if getattr(module, "__name__", "").startswith("onnx_remat") and getattr(module, name, None) is original:
                    replaced.append((module, name, original))
                    setattr(module, name, wrapped)
    return replaced


def untrace(replaced: list[tuple[object, str, object]]) -> None:
    """Put back what :func:`trace_stages` replaced (last first)."""
    for owner, name, original in reversed(replaced):
        setattr(owner, name, original)


def run(argv: list[str]) -> tuple[int, list[StageCall]]:
    """Run ``onnx-remat ARGV`` in this process with its stages traced; its exit status and the
    stage calls of it and its forked children, by start."""
    import click

    from onnx_remat import collector
    from onnx_remat.cli.main import main as group

    fd, records = tempfile.mkstemp(prefix="onnx-remat-stages-", suffix=".jsonl")
    os.close(fd)
    me = os.getpid()
    replaced = trace_stages(records)
    try:
        # As the console script runs it (onnx_remat.cli.entry.main, which ends the process itself):
        # the cyclic collector off (on again after, where it was: a test's process goes on), click's
        # exceptions turned into the exit status.
        status = 0
        try:
            with collector.paused(), group.make_context("onnx-remat", list(argv)) as ctx:
                group.invoke(ctx)
        except click.exceptions.Exit as exc:
            status = exc.exit_code
        except click.ClickException as exc:
            print(f"error: {' '.join(exc.format_message().split())}", file=sys.stderr)
            status = exc.exit_code
        if os.getpid() != me:  # a forked child that unwound to here: its records are written
            os._exit(status)
        calls = [StageCall(*json.loads(line)) for line in Path(records).read_text().splitlines() if line]
    finally:
        if os.getpid() == me:
            untrace(replaced)
            os.unlink(records)
    return status, sorted(calls, key=lambda c: (c.start, -c.end))


def render(calls: list[StageCall], command_pid: int, total: float) -> str:
    """The calls as a Markdown table: process (the command or a child), start, end, seconds, the
    stage indented by its nesting within its process; then the command's waits for its children."""
    first_start: dict[int, float] = {}  # each child's first traced start: children numbered by it
    for c in calls:
        if c.pid != command_pid:
            first_start[c.pid] = min(first_start.get(c.pid, c.start), c.start)
    children = {pid: n for n, pid in enumerate(sorted(first_start, key=first_start.__getitem__), 1)}
    lines = ["| process | start | end | seconds | stage |", "|---|---:|---:|---:|---|"]
    open_calls: dict[int, list[StageCall]] = {}
    for c in calls:
        stack = open_calls.setdefault(c.pid, [])
        while stack and stack[-1].end < c.end:
            stack.pop()
        who = "command" if c.pid == command_pid else f"child {children[c.pid]}"
        indent = "&nbsp;&nbsp;" * len(stack)
        lines.append(f"| {who} | {c.start:.2f} | {c.end:.2f} | {c.seconds:.2f} | {indent}`{c.stage}` |")
        stack.append(c)
    waited = sum(c.seconds for c in calls if c.pid == command_pid and c.stage == "Forked.result")
    lines.append("")
    lines.append(
        f"{total:.2f} s in all (interpreter start-up not included); the command waited {waited:.2f} s for its "
        f"forked children; {len(children)} forked {'child' if len(children) == 1 else 'children'} traced"
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="also write the stage calls as JSON")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the onnx-remat command line")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the onnx-remat command after --")
    status, calls = run(command)
    total = time.perf_counter() - T0
    sys.stdout.write(render(calls, os.getpid(), total))
    if args.json:
        payload = {"command": command, "status": status, "seconds": total, "calls": [asdict(c) for c in calls]}
        args.json.write_text(json.dumps(payload, indent=1) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
