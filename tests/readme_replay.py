"""Run README.md's examples in order on a fresh copy of the example models, and compare (or
rewrite) what each ``onnx-remat`` command prints.

``python tests/readme_replay.py`` checks and prints the differences;
``python tests/readme_replay.py --update`` writes the real output into README.md
(``make readme``). :mod:`tests.test_readme` runs the check.

A ````console```` block holds ``$ onnx-remat ...`` lines, each followed by what it prints. A
````python```` block is executed where it stands (in the same folder, after the commands above
it). In the expected output:

* a line ``...`` stands for any number of lines (the README shows blocks.0 and blocks.9 of ten);
* figures that are timing (``248.9 ms``, ``2.1 s``, the step-time and live-peak rows) are masked
  on both sides, as are runs of spaces and of table rules (column widths follow the figures).

The commands run with ``COLUMNS=100`` in a folder holding a copy of ``models/artifacts`` and
``models/baselines``, so their outputs (``blocks10_remat``, pictures) land there and nowhere else.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
COLUMNS = "100"
ELLIPSIS = "..."


@dataclass
class Step:
    """One example: a console command with the output README shows, or a Python block."""

    kind: str  # "command" or "python"
    text: str  # the command line (without "$ ") or the Python source
    expected: list[str] = field(default_factory=list)
    span: tuple[int, int] = (0, 0)  # where the expected lines sit in README (character offsets)


_BLOCK = re.compile(r"```(console|python)\n(.*?)```", re.S)


def parse(text: str) -> list[Step]:
    """The examples of README ``text``, in order."""
    steps: list[Step] = []
    for m in _BLOCK.finditer(text):
        body_start = m.start(2)
        if m.group(1) == "python":
            steps.append(Step("python", m.group(2), span=(m.start(2), m.end(2))))
            continue
        offset = body_start
        current: Step | None = None
        for line in m.group(2).splitlines(keepends=True):
            if line.startswith("$ "):
                current = Step("command", line[2:].strip(), span=(offset + len(line), offset + len(line)))
                steps.append(current)
            elif current is not None:
                current.expected.append(line.rstrip("\n"))
                current.span = (current.span[0], offset + len(line))
            offset += len(line)
    return steps


_TIME = re.compile(r"\b\d+(?:\.\d+)? ?(?:ms|s)\b")
_RULE = re.compile(r"[━─]+")
_VARYING_ROWS = ("step time", "live peak")


def normalize(line: str) -> str:
    """A line with timing masked and spacing and rule lengths made irrelevant."""
    line = _TIME.sub("<time>", line)
    if any(word in line for word in _VARYING_ROWS):
        line = re.sub(r"\d+(?:\.\d+)?", "<n>", line)
    line = _RULE.sub("━", line)
    return " ".join(line.split())


def matches(expected: list[str], actual: list[str]) -> bool:
    """Whether ``actual`` lines fit ``expected`` (``...`` matches any run of lines)."""
    exp = [normalize(x) for x in expected if x.strip()]
    act = [normalize(x) for x in actual if x.strip()]

    def fit(i: int, j: int) -> bool:
        while i < len(exp):
            if exp[i] == ELLIPSIS:
                return any(fit(i + 1, k) for k in range(j, len(act) + 1))
            if j >= len(act) or exp[i] != act[j]:
                return False
            i, j = i + 1, j + 1
        return j == len(act)

    return fit(0, 0)


def elide(lines: list[str]) -> list[str]:
    """README's shortening of a real output: table rows of blocks.1 .. blocks.8 become one ``...``
    (blocks.0 and blocks.9 stay), and so do the clone rows of the same blocks."""
    out: list[str] = []
    for line in lines:
        m = re.match(r"^(\s*)blocks\.[1-8](?:\s*│|\s{2,})", line)  # a table row, not wrapped prose
        if m:
            if not out or out[-1].strip() != ELLIPSIS:
                out.append(m.group(1) + ELLIPSIS)
            continue
        out.append(line)
    return out


def workspace() -> Path:
    """A fresh folder with copies of the example artifacts and baselines, as README's paths expect."""
    work = Path(tempfile.mkdtemp(prefix="onnx-remat-readme-"))
    for sub in ("artifacts", "baselines"):
        shutil.copytree(ROOT / "models" / sub, work / "models" / sub)
    return work


def run_command(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``onnx-remat ...`` as README shows it, with this environment's console script."""
    argv = shlex.split(command)
    assert argv[0] == "onnx-remat", command
    script = Path(sys.executable).with_name("onnx-remat")
    exe = [str(script)] if script.exists() else [sys.executable, "-m", "onnx_remat.cli.entry"]
    env = dict(os.environ, COLUMNS=COLUMNS, NO_COLOR="1")
    env.pop("SOURCE_DATE_EPOCH", None)
    return subprocess.run(exe + argv[1:], cwd=cwd, capture_output=True, text=True, env=env, timeout=900)


def _needs_graphviz(command: str) -> bool:
    argv = shlex.split(command)
    return len(argv) > 1 and argv[1] == "viz" and any(a.endswith((".svg", ".png", ".html")) for a in argv)


def replay(text: str, work: Path) -> list[tuple[Step, list[str], str]]:
    """Run every example of ``text`` in ``work``: ``[(step, output lines, problem or "")]``."""
    results = []
    for step in parse(text):
        if step.kind == "python":
            cwd = os.getcwd()
            os.chdir(work)
            try:
                exec(compile(step.text, "README.md", "exec"), {})
            finally:
                os.chdir(cwd)
            results.append((step, [], ""))
            continue
        if _needs_graphviz(step.text) and shutil.which("dot") is None:
            results.append((step, step.expected, ""))  # cannot draw here; not a difference
            continue
        proc = run_command(step.text, work)
        lines = proc.stdout.rstrip("\n").splitlines()
        problem = ""
        if proc.returncode != 0:
            problem = f"exit status {proc.returncode}: {proc.stderr.strip()[-500:]}"
        elif not matches(step.expected, lines):
            problem = "output differs"
        results.append((step, lines, problem))
    return results


def update(text: str, results) -> str:
    """README ``text`` with each command's expected output replaced by the real one (elided)."""
    out, last = [], 0
    for step, lines, _ in results:
        if step.kind != "command":
            continue
        start, end = step.span
        out.append(text[last:start])
        out.append("".join(line.rstrip() + "\n" for line in elide(lines)))
        last = end
    out.append(text[last:])
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="write the real outputs into README.md")
    args = parser.parse_args(argv)
    text = README.read_text()
    work = workspace()
    try:
        results = replay(text, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    bad = [(s, lines, p) for s, lines, p in results if p]
    if args.update:
        if any(p.startswith("exit status") for _, _, p in bad):
            for s, _, p in bad:
                print(f"$ {s.text}: {p}", file=sys.stderr)
            return 1
        README.write_text(update(text, results))
        print(f"README.md: {sum(1 for s, _, _ in results if s.kind == 'command')} command outputs written")
        return 0
    for s, lines, p in bad:
        print(f"$ {s.text}: {p}\n--- README\n" + "\n".join(s.expected) + "\n--- now\n" + "\n".join(lines) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
