"""One PyTorch peer configuration of ``benchmarks.realsize``, in this (fresh) process.

    python -m benchmarks.peer_step --model NAME --config CONFIG [--steps 2] [--warmup 1]

``NAME`` is looked up in ``models.realsize.REALSIZE``, ``models.corpus.CORPUS`` and
``models.MODELS``; the module, inputs, target and loss are the ones its ONNX export was made from.
``CONFIG`` is one of:

``eager``
    the module as it is;
``checkpoint``
    every repeated block (``spec.blocks``) through ``torch.utils.checkpoint.checkpoint``
    (non-reentrant; RNG state preserved, PyTorch's default);
``sac``
    selective activation checkpointing: each block through ``checkpoint`` with
    ``create_selective_checkpoint_contexts`` and a policy that saves the outputs of matrix
    products and convolutions (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``convolution``) and
    recomputes everything else;
``compile:B``
    ``torch.compile(module)`` (inductor) with ``torch._functorch.config.activation_memory_budget
    = B`` (1.0: the default partitioner's choice; lower: the min-cut partitioner recomputes more
    to fit B times the activations it would save), random ops kept saved (:func:`configure_compile`:
    without it, torch 2.13 draws new dropout masks in the backward pass below 1.0).

Measured, as onnxruntime's side is (:mod:`onnx_remat.runtime.measure`), with the gradient buffers
existing and zeroed before each step and the module in training mode (dropout on):

* ``step_time_s``: median wall time of ``steps`` forward + loss + backward steps after ``warmup``
  (compilation happens in the warm-up);
* ``live_peak_bytes``: the peak RSS growth of one such step (high-water mark reset through
  ``/proc/self/clear_refs``; the caller starts this process with glibc's
  :data:`~onnx_remat.runtime.memory.LIVE_MALLOC_ENV`);
* ``absolute_peak_bytes``: the process's peak RSS over its RSS before the module was built, over
  the whole run, which includes one AdamW step after the warm-up: parameters, gradients, both
  moments, the activations, and for ``compile:*`` what the compiler keeps.

Prints one JSON line ``{"result": {...}}`` or ``{"error": "..."}`` (exit 1).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CONFIGS = ("eager", "checkpoint", "sac")


def find_spec(name: str):
    """The ModelSpec called ``name`` in the real-size, corpus or example registries."""
    from models import MODELS
    from models.corpus import CORPUS, LARGE
    from models.realsize import REALSIZE

    for registry in (REALSIZE, CORPUS, LARGE, MODELS):
        if name in registry:
            return registry[name]
    raise KeyError(f"unknown model {name!r}")


def _sac_policy():
    import torch
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    saved = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default, aten.convolution.default}

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def wrap_blocks(blocks, config: str) -> None:
    """Route each block's ``forward`` through ``torch.utils.checkpoint`` (``checkpoint`` or ``sac``)."""
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    extra = {}
    if config == "sac":
        extra["context_fn"] = functools.partial(create_selective_checkpoint_contexts, _sac_policy())

    def wrapped(forward):
        def run(*args, **kwargs):
            return checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)

        return run

    for block in blocks:
        block.forward = wrapped(block.forward)


def configure_compile(budget: float) -> str:
    """Set ``activation_memory_budget`` and keep random ops out of the partitioner's recomputation;
    returns the note recorded in the row.

    Why (pytorch#190758, open against torch 2.13): below a budget of 1 the min-cut partitioner's
    knapsack may recompute the random ops it had banned, and the backward pass then draws new
    dropout masks (measured on ``gpt``, dropout 0.1: gradients 0.046 off at budget 0.5, against a
    largest gradient of 0.064). The fix, in this one place: a joint-graph pass
    (``torch._inductor.config.joint_custom_post_pass``, run just before partitioning) marks every
    node whose op is tagged ``nondeterministic_seeded`` as ``MUST_SAVE``. With inductor's random
    numbers that node is ``prims.inductor_seeds`` (a few bytes), so masks may still be recomputed,
    from the saved seeds, identically. At budget 0 the partitioner skips that step: refused.
    """
    import torch
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._inductor.custom_graph_pass import CustomGraphPass
    from torch.utils.checkpoint import CheckpointPolicy

    if not 0 < budget <= 1:
        raise ValueError(f"activation_memory_budget {budget}: only 0 < B <= 1 keeps dropout correct (pytorch#190758)")

    class SaveRandomOps(CustomGraphPass):
        def __call__(self, graph) -> None:
            for node in graph.nodes:
                if node.op == "call_function" and torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
                    node.meta["recompute"] = CheckpointPolicy.MUST_SAVE

        def uuid(self):  # lets inductor's graph cache key on this pass
            return "onnx-remat-save-random-ops-v1"

    functorch_config.activation_memory_budget = budget
    inductor_config.joint_custom_post_pass = SaveRandomOps()
    return "random ops saved, never recomputed (pytorch#190758 workaround)"


def run(name: str, config: str, *, steps: int, warmup: int, threads: int = 2, seed: int = 0) -> dict:
    """Measure ``config`` of model ``name`` in this process (see the module docstring)."""
    import torch

    from onnx_remat.runtime.memory import RssPeak, proc_status, reset_peak_rss

    torch.set_num_threads(threads)
    spec = find_spec(name)
    note = None
    reset_peak_rss()
    baseline = proc_status("VmRSS")
    module = spec.build()
    module.train()
    budget = None
    if config in ("checkpoint", "sac"):
        wrap_blocks(spec.blocks(module), config)
    forward = module
    if config.startswith("compile:"):
        budget = float(config.split(":", 1)[1])
        note = configure_compile(budget)
        forward = torch.compile(module)
    elif config not in CONFIGS:
        raise ValueError(f"unknown config {config!r}")
    inputs, target = spec.example_inputs(), spec.example_target()
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    torch.manual_seed(seed)

    def step():
        for p in params:
            if p.grad is not None:
                p.grad.zero_()
        loss = spec.loss(forward(*inputs), target)
        loss.backward()
        return float(loss.detach())

    compile_s = None
    losses = []
    for i in range(max(1, warmup)):
        t0 = time.perf_counter()
        losses.append(step())
        if i == 0:
            compile_s = time.perf_counter() - t0
    optimizer.step()  # the moments exist from here on: part of the absolute peak
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - t0)
    absolute = proc_status("VmHWM")
    with RssPeak() as peak:
        losses.append(step())
    return {
        "model": name,
        "config": config,
        "budget": budget,
        "threads": threads,
        "steps": steps,
        "warmup": warmup,
        "step_times": times,
        "step_time_s": statistics.median(times) if times else None,
        "first_step_s": compile_s,
        "live_peak_bytes": peak.bytes,
        "absolute_peak_bytes": None if absolute is None or baseline is None else absolute - baseline,
        "losses": losses,
        "note": note,
        "torch": torch.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peer_step", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--config", required=True, help="eager, checkpoint, sac or compile:B")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    try:
        result = run(args.model, args.config, steps=args.steps, warmup=args.warmup, threads=args.threads)
    except Exception as exc:
        message = " ".join(f"{type(exc).__name__}: {exc}".split())
        print(json.dumps({"error": message[:500]}), flush=True)
        return 1
    print(json.dumps({"result": result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
