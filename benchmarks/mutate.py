"""A structure-aware mutation fuzzer: valid training graphs changed in one place, every subcommand
run on each, onnxruntime's own load as the oracle.

    python -m benchmarks.mutate [--mutants N] [--seed S] [--graphs examples|corpus|all|small|A,B] [--out DIR]
                                [--slow-every K] [--heavy-every K] [--jobs J] [--time-limit SECONDS]
                                [--results FILE.md]

Graphs: the example artifacts (``models/artifacts``) and, with ``--graphs corpus``, ``all``,
``small`` or names, the corpus (``models/corpus.py``, exported into ``.cache/corpus/bench`` when
missing). Each
*mutant* is one graph with one mutation (:data:`MUTATIONS`: dangling inputs, duplicate producers,
deleted nodes, self-loops, unknown ops and domains, absurd dims, attributes out of range,
initializer dims, types and data that don't match, retyped inputs and outputs, a missing graph
output, opset and IR changes, truncated protobuf bytes, a flipped byte, protobuf fields written in
another order, reordered nodes, external data that
points nowhere or outside the model's folder), written as the ``training_model.onnx`` of a copy
of the artifacts directory.

The oracle is onnxruntime: an ``InferenceSession`` of the mutant with graph optimizations off.
Every subcommand then runs on the mutant in this process (click's runner): :func:`fast_commands`
on every mutant, except that on a mutant onnxruntime loads, where a command does its whole work
(seconds, not milliseconds), the :data:`HEAVY` ones run on every ``--heavy-every``-th only (on a
mutant onnxruntime refuses every command runs: that is where an exit 0 would be wrong);
:func:`slow_commands`, which run training steps, on every ``--slow-every``-th. A run fails when:

* ``traceback`` / ``internal``: it raised past the command's error handling, or printed an
  internal error;
* ``accepted``: it exited 0 on a mutant onnxruntime refuses (or wrote a file for one);
* ``wrote-refused``: it exited 0 and wrote a graph that onnxruntime refuses to load;
* ``memory``: it ran out of memory (each fuzzer process has :data:`WORKER_MEMORY` of address space).

A command that refuses a mutant onnxruntime loads is counted (``refused-loadable``), not a
failure: onnx-remat may be stricter (it refuses graphs it cannot analyse, e.g. a training graph
without a backward pass). Results: ``DIR/mutants.jsonl`` and a summary printed and returned; the
exit status is 1 when any run failed. The suite runs a short fixed-seed run (tests/test_mutate.py).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FAILURES = ("traceback", "internal", "accepted", "wrote-refused", "crash", "memory")
# Address space of one fuzzer process (and the onnxruntime workers it starts): a command that runs
# out of memory on these small graphs is a bug (the "memory" failure), and without a limit one such
# mutant took the whole run with it.
WORKER_MEMORY = 16 * 2**30


# -- mutations: each changes the model (or its bytes) in one place and says what it did ---------------


def _node(model, rng, pred=lambda n: True):
    nodes = [n for n in model.graph.node if pred(n)]
    return rng.choice(nodes) if nodes else None


def m_dangling_input(model, rng):
    n = _node(model, rng, lambda n: any(n.input))
    k = rng.choice([i for i, x in enumerate(n.input) if x])
    n.input[k] = "onnx_remat_mutant_nowhere"
    return f"{n.name} input {k} reads a tensor nothing produces"


def m_duplicate_producer(model, rng):
    a, b = rng.sample(list(model.graph.node), 2)
    b.output[0] = a.output[0]
    return f"{b.name} also produces {a.output[0]}"


def m_delete_node(model, rng):
    n = _node(model, rng)
    model.graph.node.remove(n)
    return f"deleted {n.name} ({n.op_type})"


def m_self_loop(model, rng):
    n = _node(model, rng, lambda n: any(n.input) and any(n.output))
    n.input[0] = n.output[0]
    return f"{n.name} reads its own output"


def m_unknown_op(model, rng):
    n = _node(model, rng)
    n.op_type = "OnnxRematNoSuchOp"
    return f"{n.name} is an unknown op"


def m_unknown_domain(model, rng):
    n = _node(model, rng)
    n.domain = "org.nowhere"
    return f"{n.name} in an unknown domain"


def m_absurd_dim(model, rng):
    vi = rng.choice(list(model.graph.input))
    dims = vi.type.tensor_type.shape.dim
    if not dims:
        vi.type.tensor_type.shape.dim.add().dim_value = 0
        return f"{vi.name} given a dim"
    d = rng.choice(list(dims))
    value = rng.choice([0, 10**12, -3])
    d.dim_value = value
    return f"{vi.name} dim set to {value}"


def m_attribute_out_of_range(model, rng):
    n = _node(model, rng, lambda n: any(a.type == onnx.AttributeProto.INT for a in n.attribute))
    if n is None:
        return m_unknown_op(model, rng)
    a = rng.choice([a for a in n.attribute if a.type == onnx.AttributeProto.INT])
    a.i = rng.choice([99, -99, 2**40])
    return f"{n.name} attribute {a.name} = {a.i}"


def _init(model, rng):
    inits = list(model.graph.initializer)
    return rng.choice(inits) if inits else None


def m_initializer_dims(model, rng):
    t = _init(model, rng)
    if t is None:
        return m_absurd_dim(model, rng)
    t.dims[:] = rng.choice([[1], [0], [3, 5], [10**12], [-1]])
    return f"initializer {t.name} dims {list(t.dims)}"


def m_initializer_type(model, rng):
    t = _init(model, rng)
    if t is None:
        return m_absurd_dim(model, rng)
    t.data_type = rng.choice([onnx.TensorProto.INT8, onnx.TensorProto.DOUBLE, onnx.TensorProto.STRING, 0, 77])
    return f"initializer {t.name} type {t.data_type}"


def m_initializer_data(model, rng):
    t = _init(model, rng)
    if t is None or not t.HasField("raw_data"):
        return m_initializer_dims(model, rng)
    t.raw_data = t.raw_data[: len(t.raw_data) // 2] + (b"\x01" if rng.random() < 0.5 else b"")
    return f"initializer {t.name} raw data cut to {len(t.raw_data)} bytes"


def m_retype_input(model, rng):
    vi = rng.choice(list(model.graph.input))
    vi.type.tensor_type.elem_type = rng.choice([onnx.TensorProto.STRING, onnx.TensorProto.BOOL, onnx.TensorProto.INT8])
    return f"input {vi.name} retyped"


def m_retype_output(model, rng):
    vi = rng.choice(list(model.graph.output))
    vi.type.tensor_type.elem_type = rng.choice([onnx.TensorProto.STRING, onnx.TensorProto.INT64])
    return f"output {vi.name} retyped"


def m_missing_output(model, rng):
    vi = rng.choice(list(model.graph.output))
    model.graph.output.remove(vi)
    return f"output {vi.name} removed"


def m_opset(model, rng):
    op = next(o for o in model.opset_import if o.domain in ("", "ai.onnx"))
    op.version = rng.choice([1, 7, 9, 23, 99])
    return f"default opset {op.version}"


def m_ir_version(model, rng):
    model.ir_version = rng.choice([0, 2, 11, 99])
    return f"IR version {model.ir_version}"


def m_reorder_nodes(model, rng):
    nodes = list(model.graph.node)
    i, j = sorted(rng.sample(range(len(nodes)), 2))
    nodes[i], nodes[j] = nodes[j], nodes[i]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return f"nodes {i} and {j} swapped"


def _external(model, rng, location: str) -> str:
    t = _init(model, rng)
    if t is None:
        return m_absurd_dim(model, rng)
    t.ClearField("raw_data")
    t.data_location = onnx.TensorProto.EXTERNAL
    del t.external_data[:]
    t.external_data.add(key="location", value=location)
    return f"initializer {t.name} data at {location}"


def m_external_nowhere(model, rng):
    return _external(model, rng, "onnx_remat_mutant_missing.bin")


def m_external_outside(model, rng):
    return _external(model, rng, rng.choice(["../../etc/hostname", "/etc/hostname", "../outside.bin"]))


# byte-level mutations: applied to the serialized model
def b_truncate(data: bytes, rng) -> tuple[bytes, str]:
    cut = rng.randrange(1, max(2, len(data)))
    return data[:cut], f"protobuf truncated at byte {cut} of {len(data)}"


def b_flip(data: bytes, rng) -> tuple[bytes, str]:
    i = rng.randrange(len(data))
    return data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :], f"byte {i} flipped"


MUTATIONS: dict[str, Callable] = {
    "dangling-input": m_dangling_input,
    "duplicate-producer": m_duplicate_producer,
    "delete-node": m_delete_node,
    "self-loop": m_self_loop,
    "unknown-op": m_unknown_op,
    "unknown-domain": m_unknown_domain,
    "absurd-dim": m_absurd_dim,
    "attribute-out-of-range": m_attribute_out_of_range,
    "initializer-dims": m_initializer_dims,
    "initializer-type": m_initializer_type,
    "initializer-data": m_initializer_data,
    "retype-input": m_retype_input,
    "retype-output": m_retype_output,
    "missing-output": m_missing_output,
    "opset": m_opset,
    "ir-version": m_ir_version,
    "reorder-nodes": m_reorder_nodes,
    "external-nowhere": m_external_nowhere,
    "external-outside": m_external_outside,
}


def _fields(data: bytes) -> list[tuple[int, bytes, bytes]]:
    """The wire-format fields of one protobuf message: (field number, tag bytes, payload bytes)."""

    def varint(i: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            b = data[i]
            value |= (b & 0x7F) << shift
            i, shift = i + 1, shift + 7
            if not b & 0x80:
                return value, i

    out, i = [], 0
    while i < len(data):
        key, j = varint(i)
        wire = key & 7
        if wire == 0:
            _, end = varint(j)
        elif wire == 2:
            length, k = varint(j)
            j, end = k, k + length
        else:  # fixed 64 (1) or 32 (5) bits; ONNX has no groups
            end = j + (8 if wire == 1 else 4)
        out.append((key >> 3, data[i:j], data[j:end]))
        i = end
    return out


def _shuffled(fields: list[tuple[int, bytes, bytes]], rng) -> list[tuple[int, bytes, bytes]]:
    # Fields of different numbers change places; a repeated field's elements keep their order
    # (the order of nodes, inputs and initializers is the graph's meaning, not its encoding).
    groups: dict[int, list] = {}
    for f in fields:
        groups.setdefault(f[0], []).append(f)
    order = list(groups)
    rng.shuffle(order)
    return [f for number in order for f in groups[number]]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def b_reorder_fields(data: bytes, rng) -> tuple[bytes, str]:
    """The model's and its graph's protobuf fields written in another order: the same model to
    every protobuf reader (onnxruntime loads it), so a command must treat it as the original."""
    top = []
    for number, tag, payload in _shuffled(_fields(data), rng):
        if number == 7:  # ModelProto.graph
            payload = b"".join(t + p for _, t, p in _shuffled(_fields(payload), rng))
            tag = tag[:1] + _varint(len(payload))
        top.append(tag + payload)
    return b"".join(top), "model and graph protobuf fields reordered"


BYTE_MUTATIONS = {"truncated-protobuf": b_truncate, "flipped-byte": b_flip, "reordered-fields": b_reorder_fields}


# -- the commands ---------------------------------------------------------------------------------------


def fast_commands(scope: str, out: Path) -> dict[str, list[str]]:
    """Subcommands run on every mutant (``MODEL`` is replaced by the mutant's path)."""
    return {
        "scopes": ["scopes", "MODEL"],
        "estimate": ["estimate", "MODEL", "--scope", scope],
        "apply": ["apply", "MODEL", "--scope", scope, "-o", str(out / "apply")],
        "apply-budget": ["apply", "MODEL", "--budget", "50%", "-o", str(out / "budget")],
        "schedule": ["schedule", "MODEL", "-o", str(out / "schedule")],
        "plan": ["plan", "MODEL", "--budget", "50%"],
        "viz": ["viz", "MODEL", "--scope", scope, "-o", str(out / "graph.svg")],
        "report": ["report", "MODEL", "--scope", scope, "-o", str(out / "report.html")],
    }


# the fast commands whose whole work on a loadable mutant is the budget planner or a picture
HEAVY = ("apply-budget", "plan", "viz", "report")


def slow_commands(scope: str, original: Path, out: Path) -> dict[str, list[str]]:
    """Subcommands that run training steps: on every ``--slow-every``-th mutant."""
    return {
        "measure": ["measure", "MODEL", "--steps", "1", "--warmup", "1"],
        "compare": ["compare", str(original), "MODEL", "--steps", "1", "--warmup", "1"],
        "check": ["check", "MODEL", "--scope", scope, "--baseline", str(out / "baseline.json"), "--update-baseline"],
    }


# Set in the worker that re-runs a mutant whose pool died: onnxruntime itself segfaults on some
# mutants (seen: an int64 initializer with 5 bytes of raw data), so there the oracle runs in a
# child process and a crash of onnxruntime counts as its refusal.
_ORACLE_IN_CHILD = [False]


def ort_refuses(path: Path) -> str | None:
    """onnxruntime's error loading ``path`` with graph optimizations off, else None (the oracle)."""
    if not _ORACLE_IN_CHILD[0]:
        return _load_error(path)
    import subprocess

    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
        "from benchmarks.mutate import _load_error\n"
        "error = _load_error(sys.argv[1])\n"
        "if error is not None:\n    print(error); sys.exit(1)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    if proc.returncode < 0:
        return f"onnxruntime crashed loading it (signal {-proc.returncode})"
    return (proc.stdout.strip().splitlines() or ["refused"])[-1] if proc.returncode else None


def _load_error(path: str | Path) -> str | None:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    try:
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    except Exception as exc:
        return " ".join(str(exc).split())[:200] or type(exc).__name__
    return None


@dataclass
class Run:
    command: str
    exit: int
    outcome: str  # ok (a refusal or an exit 0 that holds), refused-loadable, or one of FAILURES
    message: str = ""
    seconds: float = 0.0


@dataclass
class Mutant:
    index: int
    graph: str
    mutation: str
    what: str
    ort_refuses: str | None
    runs: list[Run] = field(default_factory=list)


def _written(path: Path) -> Path | None:
    if path.is_dir() and (path / "training_model.onnx").exists():
        return path / "training_model.onnx"
    return path if path.is_file() and path.suffix == ".onnx" else None


def run_command(runner, group, argv: list[str], refused: str | None, out: Path) -> Run:
    """One subcommand on a mutant in this process; its outcome judged against the oracle."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    result = runner.invoke(group, argv, catch_exceptions=True)
    text = (result.output or "") + (getattr(result, "stderr", "") or "")
    name = argv[0]
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        tb = "".join(traceback.format_exception(result.exception))[-600:]
        return Run(name, -1, "traceback", " ".join(tb.split()))
    if "internal error" in text or "Traceback" in text:
        return Run(name, result.exit_code, "internal", " ".join(text.split())[-300:])
    if "out of memory" in text:
        return Run(name, result.exit_code, "memory", " ".join(text.split())[-300:])
    written = [p for p in out.iterdir()]
    if result.exit_code == 0:
        if refused is not None:
            return Run(name, 0, "accepted", f"exit 0 on a model onnxruntime refuses: {refused[:120]}")
        for p in written:
            graph = _written(p)
            if graph is not None:
                err = ort_refuses(graph)
                if err is not None:
                    return Run(name, 0, "wrote-refused", err)
        return Run(name, 0, "ok")
    if refused is not None and written:
        # nothing at all, not only a graph: a report or picture of a refused model is an exit-0 in disguise
        return Run(name, result.exit_code, "accepted", f"wrote {written[0].name} for a model onnxruntime refuses")
    last = text.strip().splitlines()[-1] if text.strip() else ""
    return Run(name, result.exit_code, "ok" if refused is not None else "refused-loadable", last[:200])


# The long run's graphs: the smallest of the examples and the corpus (a loadable mutant costs every
# command its whole work: 2-5 s here, 20-30 s for GPT or BART), six architectures, both exporters.
SMALL = ("fc5", "blocks10", "blocks10_dynamo", "resnet", "mlp_ts", "mlp_dynamo", "resnet_ts", "convnext_ts", "vit_ts")


def graphs(which: str) -> dict[str, tuple[Path, str]]:
    """name -> (artifacts directory, block scope) of the graphs to mutate: ``examples``, ``corpus``
    (its TorchScript exports), ``all``, ``small`` (:data:`SMALL`) or names separated by commas."""
    from models import MODELS
    from models.corpus import CORPUS

    examples = {name: (ROOT / "models" / "artifacts" / name, spec.block_scope) for name, spec in MODELS.items()}
    names = {
        "examples": list(examples),
        "corpus": [n for n in CORPUS if n.endswith("_ts")],
        "all": [*examples, *(n for n in CORPUS if n.endswith("_ts"))],
        "small": list(SMALL),
    }.get(which) or which.split(",")
    out = {}
    for name in names:
        if name in examples:
            out[name] = examples[name]
        elif name in CORPUS:
            from models.export import export_artifacts

            cache = ROOT / ".cache" / "corpus" / "bench"
            if not (cache / name / "training_model.onnx").exists():
                export_artifacts(CORPUS[name], cache)
            out[name] = (cache / name, CORPUS[name].block_scope)
        else:
            raise SystemExit(f"--graphs: no example or corpus graph named {name!r}")
    return out


def make_mutant(src: Path, dest: Path, kind: str, rng: random.Random) -> str:
    """Copy the artifacts ``src`` into ``dest`` and mutate its training graph by ``kind``."""
    shutil.copytree(src, dest)
    path = dest / "training_model.onnx"
    if kind in BYTE_MUTATIONS:
        data, what = BYTE_MUTATIONS[kind](path.read_bytes(), rng)
        path.write_bytes(data)
        return what
    model = onnx.load(str(path))
    what = MUTATIONS[kind](model, rng)
    path.write_bytes(model.SerializeToString())
    return what


_POOL: dict[str, tuple[Path, str]] = {}


def mutant_case(i: int, seed: int, out_dir: str, slow_every: int, heavy_every: int = 1) -> dict:
    """Mutant number ``i`` of the run seeded ``seed``: made, judged by onnxruntime, every command
    run on it; its record (a JSON-ready dict). Deterministic in ``(seed, i)``, whatever the jobs."""
    from click.testing import CliRunner

    from onnx_remat.cli.main import main as group

    pool = _POOL
    rng = random.Random(seed * 1_000_003 + i)
    kinds = [*MUTATIONS, *BYTE_MUTATIONS]
    name = rng.choice(sorted(pool))
    src, scope = pool[name]
    kind = kinds[i % len(kinds)]
    work = Path(tempfile.mkdtemp(prefix="mutant-", dir=out_dir))
    try:
        art = work / name
        try:
            what = make_mutant(src, art, kind, random.Random(rng.random()))
        except Exception as exc:  # a mutation that does not apply to this graph
            what = f"not applied: {type(exc).__name__}"
        refused = ort_refuses(art / "training_model.onnx")
        m = Mutant(i, name, kind, what, refused)
        outputs = work / "out"
        commands = fast_commands(scope, outputs)
        if refused is None and heavy_every > 1 and i % heavy_every:
            commands = {k: v for k, v in commands.items() if k not in HEAVY}
        if slow_every and i % slow_every == 0:
            commands.update(slow_commands(scope, src, outputs))
        for label, argv in commands.items():
            argv = [str(art) if a == "MODEL" else a for a in argv]
            started = time.perf_counter()
            r = run_command(CliRunner(), group, argv, refused, outputs)
            r.command = label
            r.seconds = round(time.perf_counter() - started, 3)
            m.runs.append(r)
        return asdict(m)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _init_worker(pool: dict[str, tuple[Path, str]], limit_memory: bool = False, oracle_in_child: bool = False) -> None:
    _ORACLE_IN_CHILD[0] = oracle_in_child
    if limit_memory:  # a pool worker only: never the caller's process (a test suite's)
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard == resource.RLIM_INFINITY or hard > WORKER_MEMORY:
            resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, hard))
    _POOL.clear()
    _POOL.update(pool)


def _pool_round(nxt, mutants, jobs, pool, record, log_file, seed, out_dir, slow_every, heavy_every, start, limit):
    """Mutants from ``nxt`` on in a pool until done, out of time, or the pool breaks; returns the next
    index and the indices in flight when it broke."""
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    in_flight: dict = {}
    with ProcessPoolExecutor(jobs, initializer=_init_worker, initargs=(pool, True)) as ex:
        while nxt < mutants or in_flight:
            while nxt < mutants and len(in_flight) < 2 * jobs and not (limit and time.perf_counter() - start > limit):
                in_flight[ex.submit(mutant_case, nxt, seed, str(out_dir), slow_every, heavy_every)] = nxt
                nxt += 1
            if not in_flight:
                break
            finished, _ = wait(set(in_flight), return_when=FIRST_COMPLETED)
            for f in finished:
                try:
                    m = f.result()
                except BrokenProcessPool:
                    return nxt, sorted(in_flight.values())
                del in_flight[f]
                record(m, log_file)
    return nxt, []


def _alone(i, pool, seed, out_dir, slow_every, heavy_every) -> dict:
    """Mutant ``i`` in a pool of its own: its record, or a ``crash`` record when its worker dies."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    with ProcessPoolExecutor(1, initializer=_init_worker, initargs=(pool, True, True)) as ex:
        try:
            return ex.submit(mutant_case, i, seed, str(out_dir), slow_every, heavy_every).result()
        except BrokenProcessPool:
            run = asdict(Run("(worker)", -11, "crash", "the process died (a signal: segfault or out of memory)"))
            return {"index": i, "graph": "?", "mutation": "?", "what": "?", "ort_refuses": None, "runs": [run]}


def run(
    mutants: int,
    seed: int,
    which: str,
    out_dir: Path,
    slow_every: int,
    *,
    heavy_every: int = 1,
    jobs: int = 1,
    time_limit: float = 0,
    log=print,
) -> dict:
    """The fuzzer loop (``jobs`` worker processes; ``jobs=0``: in this process, where a mutant that
    crashes onnxruntime takes the caller down with it; stops early, counting what ran, after
    ``time_limit`` seconds when given); returns the summary (also written to
    ``out_dir/summary.json``)."""

    pool = graphs(which)
    out_dir.mkdir(parents=True, exist_ok=True)
    counts: Counter = Counter()
    per_kind: Counter = Counter()
    kind_refused: Counter = Counter()
    per_command: Counter = Counter()
    command_seconds: Counter = Counter()
    per_graph: Counter = Counter()
    exit0: Counter = Counter()
    refused_by_ort = 0
    done = 0
    failures: list[dict] = []
    start = time.perf_counter()

    def record(m: dict, log_file) -> None:
        nonlocal refused_by_ort, done
        done += 1
        refused_by_ort += m["ort_refuses"] is not None
        per_kind[m["mutation"]] += 1
        kind_refused[m["mutation"]] += m["ort_refuses"] is not None
        per_graph[m["graph"]] += 1
        for r in m["runs"]:
            counts[r["outcome"]] += 1
            per_command[r["command"]] += 1
            command_seconds[r["command"]] += r["seconds"]
            exit0[r["command"]] += r["exit"] == 0
            if r["outcome"] in FAILURES:
                failures.append(
                    {"mutant": m["index"], "graph": m["graph"], "mutation": m["mutation"], "what": m["what"], **r}
                )
        log_file.write(json.dumps(m) + "\n")
        if done % 100 == 0:
            log(f"[{done}/{mutants} mutants, {time.perf_counter() - start:.0f} s] {dict(counts)}")

    with (out_dir / "mutants.jsonl").open("w") as log_file:
        if jobs <= 0:
            _init_worker(pool)
            for i in range(mutants):
                if time_limit and time.perf_counter() - start > time_limit:
                    break
                record(mutant_case(i, seed, str(out_dir), slow_every, heavy_every), log_file)
        else:
            nxt = 0
            while nxt < mutants and not (time_limit and time.perf_counter() - start > time_limit):
                # a worker killed by a signal (a segfault in a C++ library on some mutant) breaks the
                # whole pool: the mutants in flight are then run again one by one to find it
                nxt, broken = _pool_round(
                    nxt,
                    mutants,
                    jobs,
                    pool,
                    record,
                    log_file,
                    seed,
                    out_dir,
                    slow_every,
                    heavy_every,
                    start,
                    time_limit,
                )
                for i in broken:
                    record(_alone(i, pool, seed, out_dir, slow_every, heavy_every), log_file)
    summary = {
        "mutants": done,
        "seed": seed,
        "slow_every": slow_every,
        "heavy_every": heavy_every,
        "graphs": sorted(pool),
        "seconds": round(time.perf_counter() - start, 1),
        "refused_by_onnxruntime": refused_by_ort,
        "runs": dict(counts),
        "per_mutation": dict(per_kind),
        "per_mutation_refused_by_onnxruntime": dict(kind_refused),
        "per_command": dict(per_command),
        "per_command_exit0": dict(exit0),
        "per_command_seconds": {k: round(v, 1) for k, v in command_seconds.items()},
        "per_graph": dict(per_graph),
        "failures": failures[:50],
        "failed": sum(counts[f] for f in FAILURES),
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def write_results(summary: dict, command: str, md: Path) -> None:
    """The run written down: ``md`` (a table per mutation kind and per subcommand) and the summary
    beside it as JSON, with the command that repeats it."""
    summary = {"command": command, **summary}
    md.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    runs = summary["runs"]
    lines = [
        "# Mutation fuzzer: the long run",
        "",
        f"`{command}`",
        "",
        f"{summary['mutants']:,} mutants of {len(summary['graphs'])} graphs ({', '.join(summary['graphs'])}), "
        f"seed {summary['seed']}, {summary['seconds']:,.0f} s; onnxruntime 1.19.2 (graph optimizations off) "
        f"refuses {summary['refused_by_onnxruntime']:,} of them.",
        "",
        f"{sum(runs.values()):,} command runs: **{summary['failed']} failures** "
        + ", ".join(f"{runs.get(f, 0)} {f}" for f in FAILURES)
        + f"; {runs.get('ok', 0):,} ok (a one-line refusal of a refused mutant, or an exit 0 that holds); "
        f"{runs.get('refused-loadable', 0):,} refusals of a mutant onnxruntime loads (onnx-remat is stricter "
        "there: a graph it cannot analyse, a node list not in order, a declared tensor larger than any device, "
        "a budget below the lowest peak).",
        "",
        "Failure classes: `traceback` (raised past the command's error handling), `internal` (printed an internal",
        "error), `accepted` (exit 0, or any file written, for a mutant onnxruntime refuses), `wrote-refused` (exit 0",
        "and a written graph onnxruntime refuses to load), `memory` (ran out of memory; each worker has",
        f"{WORKER_MEMORY // 2**30} GiB of address space).",
        "",
        "| mutation | mutants | refused by onnxruntime |",
        "|---|---:|---:|",
    ]
    refused = summary["per_mutation_refused_by_onnxruntime"]
    lines += [f"| {k} | {n:,} | {refused.get(k, 0):,} |" for k, n in sorted(summary["per_mutation"].items())]
    lines += ["", "| subcommand | runs | exit 0 | seconds |", "|---|---:|---:|---:|"]
    exit0, secs = summary["per_command_exit0"], summary["per_command_seconds"]
    lines += [
        f"| {k} | {n:,} | {exit0.get(k, 0):,} | {secs.get(k, 0):,.0f} |" for k, n in summary["per_command"].items()
    ]
    lines += ["", "| graph | mutants |", "|---|---:|"]
    lines += [f"| {k} | {n:,} |" for k, n in sorted(summary["per_graph"].items())]
    md.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mutate", description=__doc__.split("\n")[0])
    parser.add_argument("--mutants", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--graphs", default="examples", help="examples, corpus, all, small, or names with commas")
    parser.add_argument("--slow-every", type=int, default=20, help="run measure/compare/check on every K-th mutant")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "onnx-remat-mutate")
    parser.add_argument(
        "--heavy-every", type=int, default=1, help="on mutants onnxruntime loads, run the HEAVY commands on every K-th"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="worker processes (default 1; 0: in this process, for debugging)"
    )
    parser.add_argument("--time-limit", type=float, default=0, help="stop starting mutants after this many seconds")
    parser.add_argument("--results", type=Path, help="write the run down here (a .md file, and .json beside it)")
    args = parser.parse_args(argv)
    summary = run(
        args.mutants,
        args.seed,
        args.graphs,
        args.out,
        args.slow_every,
        heavy_every=args.heavy_every,
        jobs=args.jobs,
        time_limit=args.time_limit,
    )
    if args.results:
        write_results(summary, "python -m benchmarks.mutate " + " ".join(argv or sys.argv[1:]), args.results)
    print(json.dumps({k: v for k, v in summary.items() if k != "failures"}, indent=1))
    for f in summary["failures"][:20]:
        print(
            f"FAIL {f['outcome']}: mutant {f['mutant']} {f['graph']} {f['mutation']} ({f['what']}), "
            f"{f['command']}: {f['message'][:200]}"
        )
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
