"""A randomized equivalence fuzzer: random PyTorch modules -> training artifacts -> random
selections -> the rewrite run by onnxruntime-training against the original.

    python -m benchmarks.fuzz [--models N] [--selections K] [--seed S] [--out DIR] [--jobs J]

Each *model* is a random module (seeded by ``--seed`` and its index): blocks of Linear, Conv2d,
LayerNorm, BatchNorm, Dropout, GELU / ReLU / Tanh / Softmax, small self-attention, residuals,
nested submodules, tied weights and parallel residual blocks (two sibling branches off one input,
each ending in a dropout), in a sequence or an image family; exported with the
TorchScript exporter at opset 14-17 or with the dynamo exporter, turned into artifacts by
:func:`onnx_remat.runtime.artifacts.generate_training_artifacts`. Each *case* is one selection on
one model: a scope glob, a single scope, a class name, op types, a node, with or without
``--recompute-outputs``, a memory budget (a share of the unrewritten peak), or the memory
schedule alone (``onnx_remat.schedule``). A case's outcome:

* ``ok``: the rewrite ran; loss and every gradient are bit-identical (compared single-threaded
  where kernels race) and the measured planned peak is no higher than the original's;
* ``nothing``: ``apply`` found nothing to recompute (a one-line reason; not a failure);
* failures: ``refused`` (a valid graph refused at load), ``crash`` (an exception that is not a
  one-line user error), ``runtime`` (a written rewrite onnxruntime cannot run), ``mismatch``
  (loss or a gradient differs), ``peak`` (the measured planned peak rose), ``budget`` (the
  measured planned peak is above the budget the plan was made for).

Every case is a line of ``DIR/cases.jsonl``; a failing case's artifacts and selection are kept in
``DIR/failures/<case>/`` to become a regression test. The summary line at the end counts the
outcomes; the exit status is 1 when any case failed. The test suite runs a few fixed seeds
(tests/test_fuzz.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

FAILURES = ("refused", "crash", "runtime", "mismatch", "peak", "budget")
OUTCOMES = ("ok", "nothing", *FAILURES)


# -- random modules ----------------------------------------------------------------------------


def _torch():
    import torch

    return torch


def _layer_classes():
    """The building blocks, defined once (classes named like real code, so class-name selection works)."""
    torch = _torch()
    nn = torch.nn

    class SelfAttention(nn.Module):
        def __init__(self, width: int, heads: int, p: float) -> None:
            super().__init__()
            self.heads = heads
            self.qkv = nn.Linear(width, 3 * width)
            self.proj = nn.Linear(width, width)
            self.drop = nn.Dropout(p)

        def forward(self, x):
            b, s, c = x.shape
            q, k, v = self.qkv(x).split(c, dim=-1)
            h = self.heads
            q = q.reshape(b, s, h, c // h).transpose(1, 2)
            k = k.reshape(b, s, h, c // h).transpose(1, 2)
            v = v.reshape(b, s, h, c // h).transpose(1, 2)
            att = torch.softmax((q @ k.transpose(-2, -1)) * (c // h) ** -0.5, dim=-1)
            y = (self.drop(att) @ v).transpose(1, 2).reshape(b, s, c)
            return self.proj(y)

    class Residual(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return x + self.inner(x)

    class PostNorm(nn.Module):
        """``LN(x + f(x))``: BERT's shape."""

        def __init__(self, inner: nn.Module, width: int) -> None:
            super().__init__()
            self.inner = inner
            self.norm = nn.LayerNorm(width)

        def forward(self, x):
            return self.norm(x + self.inner(x))

    class ChannelNorm(nn.Module):
        """BatchNorm1d over the feature axis of a (batch, seq, width) tensor."""

        def __init__(self, width: int) -> None:
            super().__init__()
            self.bn = nn.BatchNorm1d(width)

        def forward(self, x):
            return self.bn(x.transpose(1, 2)).transpose(1, 2)

    class Softmax(nn.Module):
        def forward(self, x):
            return torch.softmax(x, dim=-1)

    class Scale(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.rand(width) + 0.5)

        def forward(self, x):
            return x * self.weight

    class Parallel(nn.Module):
        """GPT-NeoX's parallel residual: ``x + drop_a(a(x)) + drop_b(b(x))``, two sibling branches
        off one input, each holding random ops (a shape that once broke the random-op pins)."""

        def __init__(self, a: nn.Module, b: nn.Module, p: float) -> None:
            super().__init__()
            self.a, self.b = a, b
            self.drop_a, self.drop_b = nn.Dropout(p), nn.Dropout(p)

        def forward(self, x):
            return x + self.drop_a(self.a(x)) + self.drop_b(self.b(x))

    blocks = {name: type(name, (nn.Sequential,), {}) for name in ("Block", "Layer", "Mixer", "Stage", "Cell")}
    return {
        "SelfAttention": SelfAttention,
        "Residual": Residual,
        "PostNorm": PostNorm,
        "ChannelNorm": ChannelNorm,
        "Softmax": Softmax,
        "Scale": Scale,
        "Parallel": Parallel,
        **blocks,
    }


_CLASSES: dict | None = None


def classes() -> dict:
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = _layer_classes()
    return _CLASSES


@dataclass
class FuzzModel:
    """A random module with its inputs, loss and exporter, and how it was drawn."""

    seed: int
    family: str
    exporter: str
    opset: int
    loss: str  # "mse" or "mean"
    description: list[str] = field(default_factory=list)
    parallel: bool = False  # one block is a parallel residual (drawn from a stream of its own, see draw_model)


def _seq_op(rng: random.Random, width: int, depth: int, desc: list[str]):
    """One random sublayer keeping (batch, seq, width)."""
    torch = _torch()
    nn = torch.nn
    c = classes()
    kinds = [
        "linear",
        "linear",
        "ln",
        "bn",
        "dropout",
        "gelu",
        "relu",
        "tanh",
        "softmax",
        "attn",
        "scale",
        "residual",
        "postnorm",
        "nested",
    ]
    if depth >= 2:
        kinds = [k for k in kinds if k not in ("residual", "postnorm", "nested")]
    kind = rng.choice(kinds)
    desc.append(kind)
    if kind == "linear":
        return nn.Linear(width, width, bias=rng.random() < 0.8)
    if kind == "ln":
        return nn.LayerNorm(width)
    if kind == "bn":
        return c["ChannelNorm"](width)
    if kind == "dropout":
        return nn.Dropout(rng.choice([0.1, 0.25, 0.5]))
    if kind == "gelu":
        return nn.GELU(approximate=rng.choice(["none", "tanh"]))
    if kind == "relu":
        return nn.ReLU()
    if kind == "tanh":
        return nn.Tanh()
    if kind == "softmax":
        return c["Softmax"]()
    if kind == "scale":
        return c["Scale"](width)
    if kind == "attn":
        return c["SelfAttention"](width, rng.choice([h for h in (1, 2, 4) if width % h == 0]), rng.choice([0.0, 0.1]))
    inner = nn.Sequential(*[_seq_op(rng, width, depth + 1, desc) for _ in range(rng.randint(1, 3))])
    if kind == "residual":
        return c["Residual"](inner)
    if kind == "postnorm":
        return c["PostNorm"](inner, width)
    return inner  # nested


def _conv_op(rng: random.Random, channels: int, depth: int, desc: list[str]):
    """One random sublayer keeping (batch, channels, h, w)."""
    torch = _torch()
    nn = torch.nn
    c = classes()
    kinds = ["conv", "conv", "bn", "relu", "dropout", "maxpool", "gelu", "residual", "nested"]
    if depth >= 2:
        kinds = [k for k in kinds if k not in ("residual", "nested")]
    kind = rng.choice(kinds)
    desc.append(kind)
    if kind == "conv":
        k = rng.choice([1, 3])
        return nn.Conv2d(channels, channels, k, padding=k // 2, bias=rng.random() < 0.5)
    if kind == "bn":
        return nn.BatchNorm2d(channels)
    if kind == "relu":
        return nn.ReLU()
    if kind == "gelu":
        return nn.GELU()
    if kind == "dropout":
        return nn.Dropout(rng.choice([0.1, 0.3]))
    if kind == "maxpool":
        return nn.MaxPool2d(3, stride=1, padding=1)
    inner = nn.Sequential(*[_conv_op(rng, channels, depth + 1, desc) for _ in range(rng.randint(1, 3))])
    return c["Residual"](inner) if kind == "residual" else inner


def build(spec: FuzzModel):
    """``(module, inputs, target)`` for ``spec`` (deterministic in ``spec.seed``)."""
    torch = _torch()
    nn = torch.nn
    rng = random.Random(spec.seed)
    torch.manual_seed(spec.seed)
    c = classes()
    n_blocks = rng.randint(2, 4)
    block_cls = c[rng.choice(["Block", "Layer", "Mixer", "Stage", "Cell"])]
    desc = spec.description
    if spec.family == "seq":
        width = rng.choice([32, 64, 96])
        batch, seq = rng.choice([4, 8]), rng.choice([32, 64])
        same = rng.random() < 0.5  # repeated identical blocks, or each drawn anew
        proto_rng_state = rng.getstate()
        blocks = []
        for _ in range(n_blocks):
            if same:
                rng.setstate(proto_rng_state)
            blocks.append(block_cls(*[_seq_op(rng, width, 0, desc) for _ in range(rng.randint(2, 5))]))
        tie = rng.random() < 0.3
        if spec.parallel:
            # Drawn from a stream of its own, so that every other choice of the seed stays as it was.
            side = random.Random(spec.seed * 104729 + 17)
            branches = [
                nn.Sequential(*[_seq_op(side, width, 1, desc) for _ in range(side.randint(1, 3))]) for _ in range(2)
            ]
            where = side.randrange(len(blocks))
            blocks[where] = block_cls(c["Parallel"](*branches, side.choice([0.1, 0.25])))
            desc.append(f"parallel block {where}")

        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.embed = nn.Linear(width, width)
                self.blocks = nn.ModuleList(blocks)
                self.head = nn.Linear(width, width, bias=False)
                if tie:
                    self.head.weight = self.embed.weight  # tied weights

            def forward(self, x):
                x = self.embed(x)
                for b in self.blocks:
                    x = b(x)
                return self.head(x)

        if tie:
            desc.append("tied")
        module = Net()
        x = torch.randn(batch, seq, width, generator=torch.Generator().manual_seed(spec.seed))
        target = torch.randn(batch, seq, width, generator=torch.Generator().manual_seed(spec.seed + 1))
    else:
        channels = rng.choice([8, 16])
        size = rng.choice([16, 24])
        batch = rng.choice([4, 8])
        blocks = [
            block_cls(*[_conv_op(rng, channels, 0, desc) for _ in range(rng.randint(2, 4))]) for _ in range(n_blocks)
        ]

        class ConvNet(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.stem = nn.Conv2d(3, channels, 3, padding=1)
                self.blocks = nn.Sequential(*blocks)
                self.head = nn.Conv2d(channels, 2, 1)

            def forward(self, x):
                return self.head(self.blocks(self.stem(x)))

        module = ConvNet()
        x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(spec.seed))
        target = torch.randn(batch, 2, size, size, generator=torch.Generator().manual_seed(spec.seed + 1))
    if spec.loss == "mean":
        target = None
    return module, (x,), target


def draw_model(seed: int) -> FuzzModel:
    rng = random.Random(seed * 7919 + 1)
    family = "seq" if rng.random() < 0.75 else "conv"
    if rng.random() < 0.2:
        exporter, opset = "dynamo", 18
    else:
        exporter, opset = "torchscript", rng.choice([14, 15, 16, 17])
    loss = rng.choice(["mse", "mse", "mean"])
    # A stream of its own: the models the seeds drew before parallel blocks existed stay the same
    # apart from the parallel block.
    parallel = family == "seq" and random.Random(seed * 15485863 + 5).random() < 0.3
    return FuzzModel(seed=seed, family=family, exporter=exporter, opset=opset, loss=loss, parallel=parallel)


# -- selections --------------------------------------------------------------------------------


def draw_selections(analysis, rng: random.Random, k: int) -> list[dict]:
    """``k`` random selections that exist in the graph (apply's keyword arguments)."""
    tree = analysis.scopes
    scopes = [s for s in tree.scopes() if s.all_nodes()]
    forward = [n for n in analysis.graph.forward_nodes if n.name]
    ops = sorted({n.op for n in forward})
    classes_ = sorted({s.short_class for s in scopes if s.short_class})
    block_classes = [c for c in classes_ if c in ("Block", "Layer", "Mixer", "Stage", "Cell")]
    pool: list[dict] = []
    if any(s.path.startswith("blocks.") for s in scopes):
        pool.append({"scopes": ["blocks.*"]})
    pool += [{"scopes": [s.path]} for s in rng.sample(scopes, min(3, len(scopes)))]
    pool += [{"scopes": [c]} for c in rng.sample(classes_, min(3, len(classes_)))]
    pool += [{"scopes": [c], "recompute_outputs": True} for c in block_classes]
    pool += [{"op_types": rng.sample(ops, rng.randint(1, min(2, len(ops))))} for _ in range(2)]
    pool += [{"nodes": [n.name]} for n in rng.sample(forward, min(2, len(forward)))]
    # The budget planner (a share of the unrewritten peak) and the memory schedule alone.
    pool += [{"budget": f"{rng.choice((30, 45, 60, 75, 90))}%"}, {"schedule_only": True}]
    rng.shuffle(pool)
    # The repeated-block selection users ask for first, then random others.
    first = [{"scopes": [block_classes[0]]}] if block_classes else []
    out = first + [p for p in pool if p not in first]
    return out[:k]


# -- running cases -----------------------------------------------------------------------------


@dataclass
class Case:
    model: int
    index: int
    exporter: str
    opset: int
    family: str
    selection: dict
    outcome: str = ""
    detail: str = ""
    nodes: int = 0
    peak_before: int | None = None
    peak_after: int | None = None
    estimate_before: int | None = None
    estimate_after: int | None = None
    clones: int = 0
    seconds: float = 0.0


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:400]


def run_model(seed: int, selections: int, out: Path, keep_all: bool = False) -> list[Case]:
    """Draw model ``seed``, export it, and run ``selections`` cases on it."""
    import onnx_remat
    from onnx_remat.errors import RematError
    from onnx_remat.exporters import export_for_training, trainable_parameter_names
    from onnx_remat.runtime.artifacts import generate_training_artifacts
    from onnx_remat.runtime.compare import compare

    spec = draw_model(seed)
    work = Path(tempfile.mkdtemp(prefix=f"fuzz{seed}-"))
    cases: list[Case] = []

    def case(index: int, selection: dict) -> Case:
        return Case(
            model=seed, index=index, exporter=spec.exporter, opset=spec.opset, family=spec.family, selection=selection
        )

    try:
        art = work / "artifacts"
        art.mkdir()
        try:
            module, args, _target = build(spec)
            model = export_for_training(module, args, exporter=spec.exporter, opset=spec.opset, input_names=["x"])
            generate_training_artifacts(
                model, art, requires_grad=trainable_parameter_names(model, module, strict=True), loss=spec.loss
            )
        except Exception as exc:  # the exporter or generate_artifacts: not onnx-remat's failure
            c = case(0, {})
            c.outcome, c.detail = "skip", "export: " + _one_line(exc)
            return [c]
        try:
            analysis = onnx_remat.analyze_model(art)
        except RematError as exc:
            c = case(0, {})
            c.outcome, c.detail = "refused", _one_line(exc)
            _keep(out, c, art)
            return [c]
        rng = random.Random(seed)
        for index, selection in enumerate(draw_selections(analysis, rng, selections)):
            c = case(index, selection)
            c.nodes = len(analysis.graph.order)
            start = time.perf_counter()
            try:
                if selection.get("schedule_only"):
                    result = onnx_remat.schedule(art)
                else:
                    result = onnx_remat.apply(art, **selection)
            except RematError as exc:
                c.outcome, c.detail = "nothing", _one_line(exc)
            except Exception as exc:
                c.outcome, c.detail = (
                    "crash",
                    _one_line(exc) + " | " + traceback.format_exc(limit=-3).replace("\n", " "),
                )
            else:
                c.clones = getattr(result, "clone_count", 0)
                budget = result.budget.budget if getattr(result, "budget", None) is not None else None
                if result.estimate_before is not None and result.estimate_after is not None:
                    c.estimate_before = result.estimate_before.planned_peak_bytes
                    c.estimate_after = result.estimate_after.planned_peak_bytes
                rewritten = work / f"case{index}"
                try:
                    result.save(rewritten)
                    cmp = compare(art, rewritten, steps=1, warmup=1, live=False)
                except RematError as exc:
                    c.outcome, c.detail = "runtime", _one_line(exc)
                except Exception as exc:
                    c.outcome, c.detail = "crash", _one_line(exc)
                else:
                    c.peak_before, c.peak_after = cmp.a.planned_peak_bytes, cmp.b.planned_peak_bytes
                    if not cmp.equal:
                        c.outcome = "mismatch"
                        c.detail = f"{len(cmp.mismatched)} outputs differ: {', '.join(cmp.mismatched[:3])}"
                    elif c.peak_before is not None and c.peak_after is not None and c.peak_after > c.peak_before:
                        c.outcome, c.detail = "peak", f"planned peak {c.peak_before} -> {c.peak_after}"
                    elif budget is not None and c.peak_after is not None and c.peak_after > budget:
                        c.outcome, c.detail = "budget", f"measured planned peak {c.peak_after} > budget {budget}"
                    else:
                        c.outcome = "ok"
                shutil.rmtree(rewritten, ignore_errors=True)
            c.seconds = round(time.perf_counter() - start, 2)
            if c.outcome in FAILURES or keep_all:
                _keep(out, c, art)
            cases.append(c)
        return cases
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _keep(out: Path, c: Case, art: Path) -> None:
    dest = out / "failures" / f"m{c.model}-s{c.index}"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(art, dest / "artifacts")
    (dest / "case.json").write_text(json.dumps(asdict(c), indent=1))


def _run_model_safe(args) -> list[dict]:
    seed, selections, out = args
    try:
        return [asdict(c) for c in run_model(seed, selections, Path(out))]
    except Exception as exc:  # never lose the run to one model
        return [
            asdict(
                Case(
                    model=seed,
                    index=0,
                    exporter="?",
                    opset=0,
                    family="?",
                    selection={},
                    outcome="crash",
                    detail="fuzzer: " + _one_line(exc),
                )
            )
        ]


def summarize(records: list[dict]) -> dict[str, int]:
    counts = {k: 0 for k in (*OUTCOMES, "skip")}
    for r in records:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=20, help="random models (default 20)")
    parser.add_argument("--selections", type=int, default=4, help="selections per model (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="first model seed (default 0)")
    parser.add_argument("--out", type=Path, default=Path("fuzz-out"), help="output folder (default ./fuzz-out)")
    parser.add_argument("--jobs", type=int, default=1, help="models run at once (default 1)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "cases.jsonl"
    records: list[dict] = []
    start = time.perf_counter()
    work = [(args.seed + i, args.selections, str(args.out)) for i in range(args.models)]
    with open(log, "a") as fh, ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for done, cases in enumerate(pool.map(_run_model_safe, work), start=1):
            for rec in cases:
                fh.write(json.dumps(rec) + "\n")
                records.append(rec)
                if rec["outcome"] in FAILURES:
                    print(
                        f"FAIL m{rec['model']}-s{rec['index']} {rec['outcome']}: {rec['selection']} {rec['detail']}",
                        flush=True,
                    )
            fh.flush()
            counts = summarize(records)
            print(
                f"[{done}/{args.models} models, {time.perf_counter() - start:.0f} s] "
                + ", ".join(f"{k} {v}" for k, v in counts.items() if v),
                flush=True,
            )
    counts = summarize(records)
    failed = sum(counts[k] for k in FAILURES)
    print(
        f"{len(records)} cases on {args.models} models in {time.perf_counter() - start:.0f} s: "
        + ", ".join(f"{k} {v}" for k, v in counts.items())
        + f"; {'FAILED' if failed else 'PASSED'}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
