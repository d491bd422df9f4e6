"""Hostile input through the real console script, every subcommand (issue 13).

Each refused case asserts: the exit status (1 input, 2 usage), exactly one line on stderr
starting with ``error:`` and naming what is wrong, no traceback, no "internal error", and the
working folder byte for byte as it was (inputs unchanged, no output, no temporary left).
Most cases stop before any model is run; the few that need onnxruntime use fc5 (small).

Then: two ``apply`` racing for one output (exactly one wins), SIGINT/SIGTERM in the middle of a
write (nothing left behind), Ctrl-C while the modules import, full and read-only file systems
(a tmpfs in a user namespace, skipped where ``unshare`` is not allowed), deterministic pictures
and reports, progress lines when stdout is not a terminal.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import _console_script, artifacts_dir
from onnx import numpy_helper

FC5 = artifacts_dir("fc5")
SCRIPT = _console_script()


# -- the working folder --------------------------------------------------------------------------


def _with_table(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` plus a 64 KiB initializer, so there is data to store externally."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.graph.initializer.append(numpy_helper.from_array(np.zeros((128, 128), np.float32), "unused_table"))
    return m


def _external(model: onnx.ModelProto, path: Path, location: str) -> None:
    """Save ``model`` with its big tensors in ``location`` (relative to the model's folder)."""
    onnx.save_model(model, str(path), save_as_external_data=True, location=location, size_threshold=1024)


def _retarget(src: Path, dst: Path, location: str) -> None:
    """A copy of the external-data model ``src`` whose tensors point at ``location``."""
    m = onnx.load(str(src), load_external_data=False)
    for t in onnx.external_data_helper._get_all_tensors(m):
        for e in t.external_data:
            if e.key == "location":
                e.value = location
    dst.write_bytes(m.SerializeToString())


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """Every input the cases use, made once; each test works on a copy."""
    w = tmp_path_factory.mktemp("hostile-template")
    shutil.copytree(FC5, w / "M")
    shutil.copy(FC5 / "training_model.onnx", w / "m.onnx")
    training = onnx.load(str(FC5 / "training_model.onnx"))
    (w / "notes.txt").write_text("this is not a model\n")
    (w / "empty.onnx").write_bytes(b"")
    (w / "random.onnx").write_bytes(np.random.default_rng(0).bytes(4096))
    (w / "truncated.onnx").write_bytes((FC5 / "training_model.onnx").read_bytes()[:5000])
    (w / "emptydir").mkdir()
    (w / "stuffdir").mkdir()
    (w / "stuffdir" / "keep.txt").write_text("mine\n")
    (w / "afile").write_text("a file, not a folder\n")
    (w / "existing.json").write_text("{}\n")
    (w / "existing.dot").write_text("digraph {}\n")
    np.save(w / "x.npy", np.zeros(3))
    (w / "rnd.npz").write_bytes(np.random.default_rng(1).bytes(1000))
    np.savez(w / "obj.npz", inputs=np.array([{"a": 1}], dtype=object))
    np.savez(w / "ok.npz", inputs=np.zeros((2048, 256), np.float32))
    (w / "ck").write_bytes(b"garbage, not a checkpoint" * 10)
    (w / "ck_odtc").write_bytes(b"\x08\x00\x00\x00ODTC" + b"\xff" * 64)  # the right header, then rubbish
    (w / "order_other.json").write_text(json.dumps(["no_such_node_a", "no_such_node_b"]))
    (w / "bad.json").write_text("{ not json")
    os.mkfifo(w / "fifo")
    # opset 99: onnxruntime 1.19 cannot load it
    high = onnx.ModelProto()
    high.CopyFrom(training)
    for op in high.opset_import:
        if op.domain in ("", "ai.onnx"):
            op.version = 99
    (w / "opset99.onnx").write_bytes(high.SerializeToString())
    # external data: good, and pointing outside the folder, at a folder, at nothing, too short
    ext = w / "ext"
    ext.mkdir()
    _external(_with_table(training), ext / "e.onnx", "e.onnx.data")
    (w / "outside.bin").write_bytes((ext / "e.onnx.data").read_bytes())
    _retarget(ext / "e.onnx", ext / "outside.onnx", "../outside.bin")
    (ext / "adir").mkdir()
    _retarget(ext / "e.onnx", ext / "dirdata.onnx", "adir")
    _retarget(ext / "e.onnx", ext / "missing.onnx", "nope.bin")
    (ext / "short.bin").write_bytes((ext / "e.onnx.data").read_bytes()[:100])
    _retarget(ext / "e.onnx", ext / "short.onnx", "short.bin")
    (w / "out").mkdir()
    (w / "out" / "new.onnx.data").write_text("someone else's data\n")
    # baselines with wrong shapes
    good = json.loads((Path(__file__).parents[2] / "models" / "baselines" / "fc5.json").read_text())
    for name, edit in {
        "sel_string": lambda b: b.update(selection="FCBlock"),
        "sel_list_of_numbers": lambda b: b["selection"].update(scopes=[1, 2]),
        "fig_string": lambda b: b["figures"].update(original_planned_peak_bytes="36 MiB"),
        "fig_bool_count": lambda b: b["figures"].update(clones="yes"),
        "no_schema": lambda b: b.pop("schema"),
    }.items():
        b = json.loads(json.dumps(good))
        edit(b)
        (w / f"{name}.json").write_text(json.dumps(b))
    (w / "fig_nan.json").write_text(json.dumps(good).replace('"clones_kept": ', '"clones_kept": NaN, "x": '))
    return w


@pytest.fixture
def work(template, tmp_path) -> Path:
    """A fresh copy of the template (the FIFO made again: copytree cannot copy one)."""
    w = tmp_path / "w"
    shutil.copytree(template, w, ignore=shutil.ignore_patterns("fifo"))
    os.mkfifo(w / "fifo")
    return w


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` (hidden ones too): kind and content hash. FIFOs are not opened."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = Path(root) / name
            rel = str(p.relative_to(folder))
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                out[rel] = "file " + hashlib.sha256(p.read_bytes()).hexdigest()
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = "dir"
            else:
                out[rel] = f"special {stat.S_IFMT(st.st_mode)}"
    return out


def run(cwd: Path, *args, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, COLUMNS="120", **(env or {}))
    return subprocess.run(
        SCRIPT + [str(a) for a in args], cwd=cwd, capture_output=True, text=True, env=full_env, timeout=timeout
    )


def assert_refused(proc: subprocess.CompletedProcess, code: int, *fragments: str) -> None:
    """Exit status ``code``, one ``error:`` line naming ``fragments``, no traceback, no internal error."""
    both = proc.stdout + proc.stderr
    assert "Traceback" not in both and "internal error" not in both, both
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "onnxruntime_src" not in lines[0] and ".cc:" not in lines[0], lines[0]  # no C++ source paths
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


# -- refused, with nothing changed -----------------------------------------------------------------

# (id, arguments, exit status, a fragment of the message)
CASES = [
    # scopes
    ("scopes-json-over-model", ["scopes", "m.onnx", "--json", "m.onnx"], 2, "this is the model"),
    ("scopes-json-over-model-force", ["scopes", "m.onnx", "--json", "m.onnx", "--force"], 2, "this is the model"),
    ("scopes-json-into-model-dir", ["scopes", "M", "--json", "M/checkpoint"], 2, "inside the model's folder"),
    ("scopes-json-exists", ["scopes", "m.onnx", "--json", "existing.json"], 1, "already exists; give --force"),
    ("scopes-json-no-folder", ["scopes", "m.onnx", "--json", "nodir/s.json"], 1, "no such directory"),
    ("scopes-json-under-file", ["scopes", "m.onnx", "--json", "afile/s.json"], 1, "is not a directory"),
    ("scopes-json-in-proc", ["scopes", "m.onnx", "--json", "/proc/s.json"], 1, "cannot write"),
    ("scopes-json-is-dir-force", ["scopes", "m.onnx", "--json", "emptydir", "--force"], 1, "is a directory"),
    ("scopes-dim-superscript", ["scopes", "m.onnx", "--dim", "batch=²"], 2, "positive integer"),
    ("scopes-dim-huge", ["scopes", "m.onnx", "--dim", "batch=99999999999999999999999"], 2, "larger than"),
    ("scopes-dim-zero", ["scopes", "m.onnx", "--dim", "batch=0"], 2, "at least 1"),
    ("scopes-dim-negative", ["scopes", "m.onnx", "--dim", "batch=-4"], 2, "positive integer"),
    ("scopes-dim-no-value", ["scopes", "m.onnx", "--dim", "batch"], 2, "name=value"),
    ("scopes-dim-unknown-name", ["scopes", "m.onnx", "--dim", "nosuchdim=8"], 2, "no symbolic dimension"),
    ("scopes-dim-twice", ["scopes", "m.onnx", "--dim", "b=2", "--dim", "b=3"], 2, "given twice"),
    ("scopes-depth-negative", ["scopes", "m.onnx", "--depth", "-1"], 2, "--depth"),
    ("scopes-text-file", ["scopes", "notes.txt"], 1, "not an ONNX model"),
    ("scopes-empty-file", ["scopes", "empty.onnx"], 1, "empty file"),
    ("scopes-random-bytes", ["scopes", "random.onnx"], 1, "random.onnx"),
    ("scopes-truncated", ["scopes", "truncated.onnx"], 1, "truncated.onnx"),
    ("scopes-fifo", ["scopes", "fifo"], 1, "not a regular file"),
    ("scopes-dev-zero", ["scopes", "/dev/zero"], 1, "not a regular file"),
    ("scopes-missing", ["scopes", "nope.onnx"], 1, "no such file"),
    ("scopes-dir-without-model", ["scopes", "emptydir"], 1, "a directory without training_model.onnx"),
    ("scopes-opset-99", ["scopes", "opset99.onnx"], 1, "opset"),
    ("scopes-ext-outside", ["scopes", "ext/outside.onnx"], 1, "outside the model's folder"),
    ("scopes-ext-is-dir", ["scopes", "ext/dirdata.onnx"], 1, "not a regular file"),
    ("scopes-ext-missing", ["scopes", "ext/missing.onnx"], 1, "is missing"),
    ("scopes-ext-short", ["scopes", "ext/short.onnx"], 1, "truncated"),
    ("scopes-json-over-ext-data", ["scopes", "ext/e.onnx", "--json", "ext/e.onnx.data", "--force"], 2, "for --json"),
    # apply
    ("apply-o-inside-input", ["apply", "M", "--scope", "FCBlock", "-o", "M/sub"], 2, "inside the model's folder"),
    ("apply-o-is-input", ["apply", "M", "--scope", "FCBlock", "-o", "M", "--force"], 2, "this is the model"),
    ("apply-o-over-model", ["apply", "m.onnx", "--scope", "runfunc*", "-o", "m.onnx", "--force"], 2, "the model"),
    ("apply-json-over-model", ["apply", "m.onnx", "--scope", "runfunc*", "--json", "m.onnx"], 2, "the model"),
    ("apply-json-is-o", ["apply", "M", "--scope", "FCBlock", "-o", "r.onnx", "--json", "r.onnx"], 2, "given as -o"),
    ("apply-json-in-new-o", ["apply", "M", "--scope", "FCBlock", "-o", "R", "--json", "R/s.json"], 1, "no such dir"),
    (
        "apply-json-inside-o",
        ["apply", "M", "--scope", "FCBlock", "-o", "emptydir", "--force", "--json", "emptydir/s.json"],
        2,
        "inside -o",
    ),
    ("apply-o-dot", ["apply", "M/training_model.onnx", "--scope", "FCBlock", "-o", ".", "--force"], 2, "not '.'"),
    ("apply-o-holds-input", ["apply", "ext/e.onnx", "--scope", "runfunc*", "-o", "ext", "--force"], 2, "holds e.onnx"),
    ("apply-o-not-artifacts", ["apply", "M", "--scope", "FCBlock", "-o", "stuffdir", "--force"], 1, "not replaced"),
    ("apply-o-dir-over-file", ["apply", "M", "--scope", "FCBlock", "-o", "afile", "--force"], 1, "is a file"),
    ("apply-o-exists", ["apply", "M", "--scope", "FCBlock", "-o", "emptydir"], 1, "already exists"),
    ("apply-o-in-proc", ["apply", "M", "--scope", "FCBlock", "-o", "/proc/out.onnx"], 1, "cannot write"),
    ("apply-o-under-file", ["apply", "M", "--scope", "FCBlock", "-o", "afile/out.onnx"], 1, "not a directory"),
    ("apply-o-no-folder", ["apply", "M", "--scope", "FCBlock", "-o", "nodir/out"], 1, "no such directory"),
    ("apply-report-not-html", ["apply", "M", "--scope", "FCBlock", "-o", "R", "--report", "r.txt"], 1, "HTML"),
    ("apply-report-over-model", ["apply", "m.onnx", "--scope", "x", "--report", "m.onnx"], 1, "HTML"),
    ("apply-ext-data-exists", ["apply", "ext/e.onnx", "--scope", "runfunc*", "-o", "out/new.onnx"], 1, "new.onnx.data"),
    ("apply-scope-nothing", ["apply", "M", "--scope", "NoSuchBlock", "-o", "R"], 1, "matches no scope"),
    ("apply-no-selection", ["apply", "M", "-o", "R"], 1, "nothing selected"),
    ("apply-forward-only", ["apply", "M/eval_model.onnx", "--scope", "FCBlock", "-o", "r.onnx"], 1, "M/training_model"),
    ("apply-opset-99", ["apply", "opset99.onnx", "--scope", "runfunc*", "-o", "r.onnx"], 1, "opset"),
    ("apply-dim-unknown", ["apply", "M", "--scope", "FCBlock", "-o", "R", "--dim", "batch=8"], 2, "no symbolic"),
    ("apply-report-stamp", ["apply", "M", "--scope", "FCBlock", "-o", "R", "--report", "r.html"], 2, "SOURCE_DATE"),
    # estimate
    ("estimate-json-over-model", ["estimate", "M", "--json", "M/training_model.onnx"], 2, "inside the model's"),
    ("estimate-plot-gif", ["estimate", "M", "--plot", "t.gif"], 1, "give a .png or .svg path"),
    ("estimate-plot-into-model", ["estimate", "M", "--plot", "M/t.png"], 2, "inside the model's folder"),
    ("estimate-plot-is-json", ["estimate", "M", "--plot", "t.svg", "--json", "t.svg"], 2, "given as --json"),
    (
        "estimate-plot-over-order",
        ["estimate", "M", "--order", "order_other.json", "--json", "order_other.json"],
        2,
        "--order",
    ),
    ("estimate-order-not-json", ["estimate", "M", "--order", "bad.json"], 1, "not JSON"),
    ("estimate-order-other-model", ["estimate", "M", "--order", "order_other.json"], 1, "none of its 2 node names"),
    ("estimate-order-fifo", ["estimate", "M", "--order", "fifo"], 1, "not a regular file"),
    ("estimate-order-missing", ["estimate", "M", "--order", "nope.json"], 1, "no such file"),
    ("estimate-top-negative", ["estimate", "M", "--top", "-1"], 2, "--top"),
    ("estimate-scope-nothing", ["estimate", "M", "--scope", "Nope"], 1, "matches no scope"),
    # measure
    ("measure-inputs-npy", ["measure", "M", "--inputs", "x.npy"], 1, "an .npy file"),
    ("measure-inputs-random", ["measure", "M", "--inputs", "rnd.npz"], 1, "not an .npz file"),
    ("measure-inputs-objects", ["measure", "M", "--inputs", "obj.npz"], 1, "Python objects"),
    ("measure-inputs-fifo", ["measure", "M", "--inputs", "fifo"], 1, "not a regular file"),
    ("measure-json-over-inputs", ["measure", "M", "--inputs", "ok.npz", "--json", "ok.npz", "--force"], 2, "--inputs"),
    ("measure-checkpoint-garbage", ["measure", "M", "--checkpoint", "ck"], 1, "not an onnxruntime-training checkpoint"),
    (
        "measure-checkpoint-corrupt",
        ["measure", "M", "--checkpoint", "ck_odtc"],
        1,
        "ck_odtc: cannot read the checkpoint",
    ),
    ("measure-checkpoint-dir", ["measure", "M", "--checkpoint", "emptydir"], 1, "not a regular file"),
    ("measure-eval-model", ["measure", "M/eval_model.onnx"], 1, "forward-only graph"),
    ("measure-steps-zero", ["measure", "M", "--steps", "0"], 2, "--steps"),
    ("measure-seed-negative", ["measure", "M", "--seed", "-1"], 2, "--seed"),
    ("measure-seed-huge", ["measure", "M", "--seed", "99999999999999999999"], 2, "--seed"),
    ("measure-device", ["measure", "M", "--device", "tpu"], 2, "--device"),
    ("measure-int-range-bad", ["measure", "M", "--int-range", "inputs"], 2, "name=low:high"),
    ("measure-int-range-empty", ["measure", "M", "--int-range", "inputs=5:1"], 2, "low must be below high"),
    ("measure-int-range-huge", ["measure", "M", "--int-range", "inputs=0:99999999999999999999"], 2, "64 bits"),
    ("measure-int-range-not-int", ["measure", "M", "--int-range", "inputs=0:5"], 1, "no integer data input"),
    ("measure-json-into-model", ["measure", "M", "--json", "M/m.json"], 2, "inside the model's folder"),
    ("measure-dim-unknown", ["measure", "M", "--dim", "batch=4"], 2, "training_model.onnx has no symbolic dimension"),
    # compare
    ("compare-atol-nan", ["compare", "M", "M", "--atol", "nan"], 2, "finite"),
    ("compare-rtol-negative", ["compare", "M", "M", "--rtol", "-1"], 2, "finite"),
    ("compare-missing-b", ["compare", "M", "nope"], 1, "no such file"),
    ("compare-json-into-b", ["compare", "m.onnx", "M", "--json", "M/c.json"], 2, "inside M/, given as B"),
    ("compare-json-over-a", ["compare", "m.onnx", "M", "--json", "m.onnx", "--force"], 2, "(A)"),
    ("compare-forward-only", ["compare", "M", "M/eval_model.onnx"], 1, "forward-only graph"),
    ("compare-checkpoint-garbage", ["compare", "M", "M", "--checkpoint", "ck"], 1, "not an onnxruntime-training"),
    # check
    ("check-no-baseline", ["check", "M", "--baseline", "none.json"], 2, "no such baseline"),
    ("check-selection-string", ["check", "M", "--baseline", "sel_string.json"], 2, "'selection' is str"),
    ("check-selection-numbers", ["check", "M", "--baseline", "sel_list_of_numbers.json"], 2, "selection.scopes"),
    ("check-figure-string", ["check", "M", "--baseline", "fig_string.json"], 2, "not a number"),
    ("check-figure-nan", ["check", "M", "--baseline", "fig_nan.json"], 2, "NaN"),
    ("check-figure-bool", ["check", "M", "--baseline", "fig_bool_count.json"], 2, "figures.clones"),
    ("check-no-schema", ["check", "M", "--baseline", "no_schema.json"], 2, "not an onnx-remat baseline"),
    ("check-baseline-not-json", ["check", "M", "--baseline", "bad.json"], 2, "not a readable baseline"),
    ("check-baseline-fifo", ["check", "M", "--baseline", "fifo"], 2, "not a regular file"),
    (
        "check-update-over-model",
        ["check", "M", "--scope", "FCBlock", "--baseline", "M/training_model.onnx", "--update-baseline"],
        2,
        "inside the model's folder",
    ),
    (
        "check-json-over-baseline",
        ["check", "M", "--baseline", "existing.json", "--json", "existing.json"],
        2,
        "--baseline",
    ),
    (
        "check-update-no-selection",
        ["check", "M", "--baseline", "new.json", "--update-baseline"],
        2,
        "give the selection",
    ),
    ("check-threshold-text", ["check", "M", "--baseline", "bad.json", "--max-peak-increase", "abc"], 2, "percentage"),
    ("check-threshold-bare", ["check", "M", "--baseline", "bad.json", "--max-time-increase", "25"], 2, "write 25%"),
    ("check-threshold-nan", ["check", "M", "--baseline", "bad.json", "--max-peak-increase", "nan"], 2, "finite"),
    ("check-threshold-negative", ["check", "M", "--baseline", "bad.json", "--max-peak-increase", "-2%"], 2, ">= 0"),
    ("check-update-over-file-model", ["check", "m.onnx", "--baseline", "m.onnx", "--update-baseline"], 2, "the model"),
    # viz
    ("viz-gif", ["viz", "M", "--scope", "FCBlock", "-o", "g.gif"], 1, "give a .dot, .svg, .png or .html path"),
    ("viz-into-model", ["viz", "M", "--scope", "FCBlock", "-o", "M/g.dot"], 2, "inside the model's folder"),
    ("viz-before-alone", ["viz", "M", "--before", "-o", "g.dot"], 1, "--before needs a selection"),
    ("viz-exists", ["viz", "M", "--scope", "FCBlock", "-o", "existing.dot"], 1, "already exists"),
    ("viz-expand-negative", ["viz", "M", "--scope", "FCBlock", "--expand", "-1", "-o", "g.dot"], 2, "--expand"),
    # report
    # schedule
    ("schedule-over-model", ["schedule", "m.onnx", "-o", "m.onnx"], 2, "this is the model"),
    ("schedule-over-model-dir", ["schedule", "M", "-o", "M"], 2, "this is the model"),
    ("schedule-into-model", ["schedule", "M", "-o", "M/x.onnx"], 2, "inside the model's folder"),
    ("schedule-json-exists", ["schedule", "m.onnx", "--json", "existing.json"], 1, "already exists; give --force"),
    ("schedule-not-a-model", ["schedule", "notes.txt"], 1, "not an ONNX model"),
    ("schedule-accumulation-bogus", ["schedule", "m.onnx", "--grad-accumulation", "bogus"], 2, "--grad-accumulation"),
    ("schedule-dim-zero", ["schedule", "M", "--dim", "batch=0"], 2, "at least 1"),
    # plan and apply --budget
    ("plan-nothing-asked", ["plan", "M"], 2, "give --budget"),
    ("plan-budget-words", ["plan", "M", "--budget", "lots"], 1, "not a budget"),
    ("plan-budget-unreachable", ["plan", "M", "--budget", "1MiB"], 1, "below the lowest planned peak"),
    ("plan-plot-gif", ["plan", "M", "--sweep", "--plot", "c.gif"], 1, "give a .png or .svg path"),
    ("plan-plot-without-sweep", ["plan", "M", "--budget", "60%", "--plot", "c.png"], 2, "add --sweep"),
    ("plan-json-exists", ["plan", "M", "--sweep", "--json", "existing.json"], 1, "already exists; give --force"),
    ("plan-json-into-model", ["plan", "M", "--sweep", "--json", "M/c.json"], 2, "inside the model's folder"),
    ("plan-profile-not-json", ["plan", "M", "--budget", "50%", "--profile", "notes.txt"], 1, "not a profile"),
    (
        "plan-profile-and-flops",
        ["plan", "M", "--budget", "50%", "--cost", "flops", "--profile", "existing.json"],
        2,
        "--cost flops",
    ),
    ("plan-points-one", ["plan", "M", "--sweep", "--points", "1"], 2, "--points"),
    ("apply-budget-unreachable", ["apply", "M", "--budget", "1MiB", "-o", "budget_out"], 1, "below the lowest"),
    ("apply-budget-and-scope", ["apply", "M", "--budget", "50%", "--scope", "FCBlock"], 2, "not both"),
    ("report-not-html", ["report", "M", "--scope", "FCBlock", "-o", "r.txt"], 1, "HTML"),
    ("report-into-model", ["report", "M", "--scope", "FCBlock", "-o", "M/r.html"], 2, "inside the model's folder"),
    ("report-order-other", ["report", "M", "--scope", "FCBlock", "-o", "r.html", "--order", "bad.json"], 1, "JSON"),
    ("report-date-epoch-bad", ["report", "M", "--scope", "FCBlock", "-o", "r.html"], 2, "SOURCE_DATE_EPOCH"),
    # the group
    ("no-such-command", ["nosuchcommand"], 2, "No such command"),
    ("missing-argument", ["apply"], 2, "Missing argument"),
]

_ENV = {"apply-report-stamp": {"SOURCE_DATE_EPOCH": "yesterday"}, "report-date-epoch-bad": {"SOURCE_DATE_EPOCH": "-1"}}


@pytest.fixture(scope="module")
def refused(request, template, tmp_path_factory) -> dict:
    """Run the selected cases, as many at once as there are CPUs (each a fresh copy of the
    template and a fresh process; most of a case's time is the interpreter importing onnx and
    numpy): ``{name: (process, folder before, folder after)}``."""
    from concurrent.futures import ThreadPoolExecutor

    wanted = {
        item.callspec.params["name"]
        for item in request.session.items
        if item.originalname == "test_refused_without_a_trace" and hasattr(item, "callspec")
    }
    base = tmp_path_factory.mktemp("refused")

    def one(case):
        name, args, _, _ = case
        w = base / name
        shutil.copytree(template, w, ignore=shutil.ignore_patterns("fifo"))
        os.mkfifo(w / "fifo")
        before = snapshot(w)
        proc = run(w, *args, env=_ENV.get(name))
        return name, (proc, before, snapshot(w))

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return dict(pool.map(one, [c for c in CASES if c[0] in wanted]))


@pytest.mark.parametrize("name, args, code, fragment", CASES, ids=[c[0] for c in CASES])
def test_refused_without_a_trace(refused, name, args, code, fragment):
    proc, before, after = refused[name]
    assert_refused(proc, code, fragment)
    assert after == before


def test_at_least_60_cases_over_every_subcommand():
    commands = {c[1][0] for c in CASES}
    assert len(CASES) >= 60
    assert {
        "scopes",
        "apply",
        "schedule",
        "plan",
        "estimate",
        "measure",
        "compare",
        "check",
        "viz",
        "report",
    } <= commands


def test_external_data_written_beside_the_output_from_any_folder(work):
    """A model with external data, written from another folder, through a symlinked folder and to
    an absolute path: the data file lands beside each output and the model loads."""
    from onnx_remat.model_io import load_model

    (work / "sub").mkdir()
    (work / "real").mkdir()
    os.symlink(work / "real", work / "link")
    for out, where in (("../o1.onnx", work), ("../link/o2.onnx", work / "real"), (str(work / "o3.onnx"), work)):
        proc = run(work / "sub", "apply", "../ext/e.onnx", "--scope", "runfunc*", "-o", out, "--no-estimate", "-q")
        assert proc.returncode == 0, proc.stderr
        name = Path(out).name
        assert (where / (name + ".data")).is_file(), os.listdir(where)
        assert load_model(where / name).external_data
    assert os.listdir(work / "sub") == []


# -- two writers, one output -----------------------------------------------------------------------


@pytest.mark.parametrize("target", ["same.onnx", "same_dir"])
def test_two_applies_to_one_output_exactly_one_wins(work, target):
    """Two ``apply -o`` to one path started together, three rounds: one succeeds, the other says
    "already exists", the output is whole and no temporary is left."""
    for round_ in range(3):
        cwd = work / f"round{round_}"
        cwd.mkdir()
        args = [*SCRIPT, "apply", str(work / "M"), "--scope", "FCBlock", "-o", target, "--no-estimate", "-q"]
        procs = [
            subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
        ]
        results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
        codes = sorted(r[0] for r in results)
        assert codes == [0, 1], results
        loser = next(r for r in results if r[0] == 1)
        assert loser[2].strip().startswith("error: ") and "already exists" in loser[2], loser
        assert len(loser[2].strip().splitlines()) == 1 and "Traceback" not in loser[2]
        assert sorted(os.listdir(cwd)) == [target]  # nothing else, no temporary
        out = cwd / target
        model = out / "training_model.onnx" if out.is_dir() else out
        onnx.load(str(model))  # whole
        if out.is_dir():
            assert sorted(os.listdir(out)) == sorted(os.listdir(FC5))


_RACE = r"""
import os, sys, time
from pathlib import Path
import onnx_remat.model_io as mio
kind, target, go, fallback = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1"
if fallback:  # no renameat2: link() for files, mkdir() for folders
    mio._renameat2 = lambda *a: False
with mio._temporary(target, is_dir=kind == "dir") as tmp:
    if kind == "dir":
        (tmp / "who").write_text(str(os.getpid()))
    else:
        tmp.write_text(str(os.getpid()))
    time.sleep(max(0.0, go - time.time()))  # every writer has its temporary: commit together
    try:
        mio._commit(tmp, target, force=False, is_dir=kind == "dir")
        print("won")
    except FileExistsError:
        print("lost")
"""


@pytest.mark.parametrize("fallback", [False, True], ids=["renameat2", "link-mkdir"])
@pytest.mark.parametrize("kind", ["file", "dir"])
def test_exclusive_commit_with_eight_writers(tmp_path, kind, fallback):
    """Eight processes that all passed the checks rename at the same instant: exactly one wins."""
    target = tmp_path / ("out" if kind == "dir" else "out.json")
    go = time.time() + 1.5
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACE, kind, str(target), str(go), "1" if fallback else "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    words = sorted(o[0].strip() for o in outs)
    assert words == ["lost"] * 7 + ["won"], outs
    assert os.listdir(tmp_path) == [target.name]  # the losers' temporaries are gone
    winner = next(p.pid for p, o in zip(procs, outs) if o[0].strip() == "won")
    content = (target / "who" if kind == "dir" else target).read_text()
    assert content == str(winner)


# -- signals ---------------------------------------------------------------------------------------

_SLOW = r"""
import sys, time
from pathlib import Path
import onnx_remat.model_io as mio
marker, where = Path(sys.argv[1]), sys.argv[2]
def pause():
    marker.write_text("mid-write")
    time.sleep(120)
if where == "copy":  # in the middle of copying the artifacts directory
    real = mio.shutil.copy2
    def copy2(src, dst, *a, **k):
        out = real(src, dst, *a, **k)
        pause()
        return out
    mio.shutil.copy2 = copy2
else:  # the model written into its temporary, not yet renamed into place
    real = mio._write_model_into
    def write(*a, **k):
        out = real(*a, **k)
        pause()
        return out
    mio._write_model_into = write
from onnx_remat.cli.entry import main
main(sys.argv[3:])
"""


def _foreground_signals() -> None:
    """preexec_fn: the child starts with SIGINT and SIGTERM at their defaults, as from a terminal.
    The suite may itself run as a background job of a non-interactive shell, which starts with
    SIGINT ignored; the console script keeps an inherited "ignore" (nohup semantics), so the
    signal tests would otherwise wait for a child that cannot be interrupted."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("where, output", [("copy", "R"), ("model", "r.onnx")], ids=["mid-copy", "before-rename"])
def test_signal_mid_write_leaves_nothing(work, tmp_path, sig, where, output):
    """The real entry point, slowed down inside the write: the temporary exists when the signal
    comes; afterwards one word, status 128 + signal, and the folder as it was."""
    before = snapshot(work)
    marker = tmp_path / "marker"
    args = ["apply", "M", "--scope", "FCBlock", "-o", output, "--json", "s.json", "--no-estimate", "-q"]
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW, str(marker), where, *args],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_foreground_signals,
    )
    deadline = time.time() + 120
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert marker.exists(), proc.communicate()
    temporaries = [n for n in os.listdir(work) if n.startswith(f".{output}.") and n.endswith(".tmp")]
    assert temporaries, os.listdir(work)  # really in the middle of the write
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, (out, err)
    assert err.strip() == ("interrupted" if sig == signal.SIGINT else "terminated"), err
    assert "Traceback" not in out + err
    assert snapshot(work) == before


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_at_any_moment_of_apply(work, sig):
    """The real console script, signalled at several moments: it either finished (a whole output)
    or stopped with one word and left the folder as it was."""
    before = snapshot(work)
    for delay in (0.3, 0.8, 1.4):
        proc = subprocess.Popen(
            [*SCRIPT, "apply", "M", "--scope", "FCBlock", "-o", "R", "--json", "s.json"],
            cwd=work,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_foreground_signals,
        )
        time.sleep(delay)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
        assert "Traceback" not in out + err and "internal error" not in out + err, err
        if proc.returncode == 0:  # it was done before the signal
            assert sorted(os.listdir(work / "R")) == sorted(os.listdir(FC5))
            json.loads((work / "s.json").read_text())
            shutil.rmtree(work / "R")
            os.remove(work / "s.json")
        else:
            assert proc.returncode == 128 + sig, (delay, out, err)
            assert err.strip().splitlines()[-1] in ("interrupted", "terminated"), err
        assert snapshot(work) == before, delay


def _handlers_installed(pid: int) -> bool:
    """Whether the process catches SIGTERM yet (Python itself only catches SIGINT)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def _ctrl_c_during_import(work: Path, delay: float) -> tuple[int, str]:
    """Start ``onnx-remat scopes M``, send Ctrl-C ``delay`` seconds after its handlers are in (while
    its modules import); its exit status and stderr."""
    proc = subprocess.Popen(
        [*SCRIPT, "scopes", "M"],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_foreground_signals,
    )
    deadline = time.time() + 30
    while not _handlers_installed(proc.pid) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.001)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
@pytest.mark.parametrize("delay", [0.0, 0.05, 0.15, 0.3])
def test_ctrl_c_while_modules_import(work, delay):
    """From the moment the console script has installed its handlers (some 15 ms after the
    interpreter starts; onnx, numpy and rich take another half second to import): Ctrl-C prints
    "interrupted", exit status 130, no traceback."""
    code, err = _ctrl_c_during_import(work, delay)
    assert "Traceback" not in err, err
    assert (code, err.strip()) in ((130, "interrupted"), (0, "")), (code, err)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_ctrl_c_anywhere_in_a_commands_import_never_crashes(work):
    """A Ctrl-C inside onnx's C++ extension's initialization aborted the process (SIGABRT or
    SIGSEGV, up to one run in five with the signal 50 ms after the handlers are in): the command's
    import now holds signals until it is done. Twenty interrupts 40-60 ms in, around that module's
    import here: each ends the command cleanly."""
    for k in range(20):
        code, err = _ctrl_c_during_import(work, 0.04 + 0.001 * k)
        assert "Traceback" not in err, err
        assert (code, err.strip()) in ((130, "interrupted"), (0, "")), (k, code, err[-500:])


def test_sigterm_while_measuring_removes_worker_files(work, tmp_path):
    """SIGTERM while onnxruntime runs in a worker: the worker is stopped, its files removed."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    proc = subprocess.Popen(
        [*SCRIPT, "measure", "M", "--steps", "200", "--no-live", "--json", "m.json"],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, TMPDIR=str(tmpdir)),
        preexec_fn=_foreground_signals,
    )
    deadline = time.time() + 60
    while not any(tmpdir.rglob("spec-*.json")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, (out, err)
    assert err.strip().splitlines()[-1] == "terminated" and "Traceback" not in err, err
    assert list(tmpdir.iterdir()) == []
    assert not (work / "m.json").exists()
    workers = [p for p in Path("/proc").glob("[0-9]*") if _cmdline_has(p, str(tmpdir))]
    assert not workers


def _cmdline_has(proc_dir: Path, text: str) -> bool:
    try:
        return text in (proc_dir / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


# -- full and read-only file systems ---------------------------------------------------------------


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt 2>/dev/null || mount -t tmpfs tmpfs /tmp"],
        capture_output=True,
    )
    return probe.returncode == 0


needs_unshare = pytest.mark.skipif(not _unshare_works(), reason="no user namespaces (unshare -rm) here")

_ON_MOUNT = 'mount -t tmpfs -o "$OPTS" tmpfs "$MNT" || exit 99; "$@"; rc=$?; ls -A "$MNT" > "$LISTING"; exit $rc'


def run_on_tmpfs(work: Path, opts: str, *args) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run the command with ``work/mnt`` a fresh tmpfs mounted with ``opts`` (``ro``, ``size=16k``);
    returns the process and what the tmpfs held afterwards."""
    mnt = work / "mnt"
    mnt.mkdir(exist_ok=True)
    listing = work.parent / "listing.txt"
    env = dict(os.environ, OPTS=opts, MNT=str(mnt), LISTING=str(listing), COLUMNS="120")
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", _ON_MOUNT, "sh", *SCRIPT, *map(str, args)],
        cwd=work,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode != 99, proc.stderr
    return proc, listing.read_text().split()


@needs_unshare
@pytest.mark.parametrize(
    "opts, args, fragment",
    [
        ("size=16k", ["estimate", "M", "--plot", "mnt/t.png"], "no space left"),
        ("size=16k", ["estimate", "M", "--plot", "mnt/t.svg"], "no space left"),
        ("size=4k", ["estimate", "M", "--json", "mnt/e.json"], "no space left"),
        ("size=1m", ["apply", "M", "--scope", "FCBlock", "-o", "mnt/R"], "no space left"),
        ("size=16k", ["apply", "m.onnx", "--scope", "runfunc*", "-o", "mnt/r.onnx"], "no space left"),
        ("size=16k", ["report", "M", "--scope", "FCBlock", "-o", "mnt/r.html"], "no space left"),
        ("ro", ["apply", "M", "--scope", "FCBlock", "-o", "mnt/R"], "read-only file system"),
        ("ro", ["scopes", "M", "--json", "mnt/s.json"], "read-only file system"),
        ("ro", ["viz", "M", "--scope", "FCBlock", "-o", "mnt/g.dot"], "read-only file system"),
        ("ro", ["check", "M", "--scope", "FCBlock", "--baseline", "mnt/b.json", "--update-baseline"], "read-only"),
    ],
    ids=[
        "plot-png",
        "plot-svg",
        "json",
        "apply-dir",
        "apply-file",
        "report",
        "ro-apply",
        "ro-json",
        "ro-viz",
        "ro-check",
    ],
)
def test_full_or_read_only_file_system(work, opts, args, fragment):
    (work / "mnt").mkdir()
    before = snapshot(work)
    proc, left = run_on_tmpfs(work, opts, *args)
    assert_refused(proc, 1, fragment)
    assert left == []  # no truncated picture, no temporary
    assert snapshot(work) == before


@needs_unshare
@pytest.mark.parametrize("option, path", [("--json", "mnt/s.json"), ("--report", "mnt/r.html")])
def test_a_later_output_failing_takes_back_the_earlier_ones(work, option, path):
    """-o is written, then --json/--report cannot be (its file system is full): -o is removed
    again, so the rerun needs no --force."""
    (work / "mnt").mkdir()
    before = snapshot(work)
    proc, left = run_on_tmpfs(work, "size=4k", "apply", "M", "--scope", "FCBlock", "-o", "R", option, path)
    assert_refused(proc, 1, "no space left")
    assert left == [] and snapshot(work) == before
    ok = run(work, "apply", "M", "--scope", "FCBlock", "-o", "R", "-q")
    assert ok.returncode == 0, ok.stderr


def test_a_folder_even_root_cannot_write(work):
    """chattr +i: root passes permission bits, not the immutable flag."""
    folder = work / "imm"
    folder.mkdir()
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i not supported here")
    try:
        before = snapshot(work)
        assert_refused(run(work, "estimate", "M", "--json", "imm/e.json"), 1, "cannot write (permission denied)")
        assert snapshot(work) == before
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


# -- deterministic bytes, progress -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["t.svg", "t.png"])
def test_plots_are_byte_identical_run_to_run(work, name):
    for out in ("a", "b"):
        proc = run(work, "estimate", "M", "--scope", "FCBlock", "--plot", f"{out}_{name}")
        assert proc.returncode == 0, proc.stderr
    assert (work / f"a_{name}").read_bytes() == (work / f"b_{name}").read_bytes()


def test_report_is_byte_identical_unless_a_date_is_asked_for(work, monkeypatch):
    for out in ("a.html", "b.html"):
        assert run(work, "report", "M", "--scope", "FCBlock", "-o", out).returncode == 0
    page = (work / "a.html").read_bytes()
    assert page == (work / "b.html").read_bytes() and b" on 20" not in page
    stamped = run(work, "report", "M", "--scope", "FCBlock", "-o", "c.html", env={"SOURCE_DATE_EPOCH": "86400"})
    assert stamped.returncode == 0, stamped.stderr
    assert b"on 1970-01-02 00:00 UTC" in (work / "c.html").read_bytes()
    from onnx_remat.show.report import report_date

    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    assert report_date(False) is None and report_date(True).year >= 2024  # --timestamp: now


def test_progress_lines_when_stdout_is_not_a_terminal(work):
    proc = run(work, "measure", "M", "--steps", "1", "--no-live")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert any("starting onnxruntime" in line for line in lines), lines
    assert any("done" in line for line in lines), lines
    assert "planned peak" in proc.stdout and "starting onnxruntime" not in proc.stdout
