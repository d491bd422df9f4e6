"""The PyTorch eager side of ``benchmarks.compare_pytorch``: ONE configuration in this (fresh) process.

    python -m benchmarks.torch_step --model blocks10 --kind live [--checkpoint] [--steps 5]

The model is ``models.MODELS[NAME]``: the module from ``build()`` (the parameters the
onnxruntime artifacts were exported from), ``example_inputs()``, ``example_target()`` and
``loss()``. With ``--checkpoint`` every repeated block (``ModelSpec.blocks(module)``) has its
``forward`` wrapped in ``torch.utils.checkpoint.checkpoint(forward, ..., use_reentrant=False)``
(RNG state preserved, PyTorch's default), so the block stores only its input and reruns in the
backward pass.

A *step* is what onnxruntime's ``training_model.onnx`` runs: forward, loss and backward into
gradient buffers that already exist (they are made by the warm-up step and zeroed in place
before each step, as onnxruntime's ``lazy_reset_grad`` overwrites its fed buffers); no optimizer
update. The module stays in training mode (dropout on, BatchNorm on batch statistics).

Two kinds, as :mod:`onnx_remat.runtime.measure` splits its own runs:

``time``
    step wall-clock times (the process's normal allocator), median taken by the caller;
``live``
    CPU: started with glibc's ``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_`` of
    :data:`onnx_remat.runtime.memory.LIVE_MALLOC_ENV` by the caller; the peak RSS growth of each
    timed step, by :class:`onnx_remat.runtime.memory.RssPeak` (the method of onnxruntime's live
    peak: high-water mark reset through ``/proc/self/clear_refs``, ``VmHWM`` after the step
    minus ``VmRSS`` before). CUDA: ``torch.cuda.max_memory_allocated()`` after the step minus
    ``torch.cuda.memory_allocated()`` before it (peak statistics reset before the step).

Prints one JSON line on stdout: ``{"result": {...}}`` (``kind``, ``model``, ``checkpoint``,
``device``, ``threads``, ``steps``, ``warmup``, ``step_times``, ``live_peak_bytes`` (max over
the timed steps, ``live`` only), ``live_peak_samples``, ``loss`` (first step),
``block_input_bytes`` (the tensor inputs of the repeated blocks, what checkpointing stores),
``torch``) or
``{"error": "..."}`` with exit status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def wrap_blocks(blocks) -> int:
    """Make each block's ``forward`` go through ``torch.utils.checkpoint`` (non-reentrant)."""
    from torch.utils.checkpoint import checkpoint

    def wrapped(forward):
        def run(*args, **kwargs):
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)

        return run

    for block in blocks:
        block.forward = wrapped(block.forward)
    return len(blocks)


def run(
    model: str,
    *,
    kind: str,
    use_checkpoint: bool,
    steps: int,
    warmup: int,
    device: str = "cpu",
    threads: int = 2,
    seed: int = 0,
) -> dict:
    """Measure ``warmup + steps`` steps of ``models.MODELS[model]`` in this process (see above)."""
    import torch

    from models import MODELS
    from onnx_remat.runtime.memory import RssPeak

    spec = MODELS[model]
    torch.set_num_threads(threads)
    module = spec.build()
    module.train()
    if use_checkpoint:
        wrap_blocks(spec.blocks(module))
    inputs = spec.example_inputs()
    target = spec.example_target()
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device cuda: torch sees no CUDA device")
        module = module.to("cuda")
        inputs = tuple(t.to("cuda") for t in inputs)
        target = target.to("cuda") if target is not None else None
    params = [p for p in module.parameters() if p.requires_grad]
    # What checkpoint stores: each block's tensor inputs (counted once, in the first step).
    seen: dict[int, int] = {}
    counting = [True]

    def count_inputs(_module, args):
        if counting[0]:
            for a in args:
                if isinstance(a, torch.Tensor):
                    seen.setdefault(a.data_ptr(), a.numel() * a.element_size())

    hooks = [b.register_forward_pre_hook(count_inputs) for b in spec.blocks(module)]
    torch.manual_seed(seed)

    def step():
        out = module(*inputs)
        loss = spec.loss(out, target)
        loss.backward()
        return loss.detach()

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    times: list[float] = []
    peaks: list[int | None] = []
    first_loss = None
    for i in range(warmup + steps):
        for p in params:
            if p.grad is not None:
                p.grad.zero_()
        sync()
        timed = i >= warmup
        if kind == "live" and timed and device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            loss = step()
            sync()
            peaks.append(torch.cuda.max_memory_allocated() - before)
        elif kind == "live" and timed:
            with RssPeak() as peak:
                loss = step()
            peaks.append(peak.bytes)
        else:
            t0 = time.perf_counter()
            loss = step()
            sync()
            dt = time.perf_counter() - t0
            if timed:
                times.append(dt)
        if first_loss is None:
            first_loss = float(loss)
            counting[0] = False
            for h in hooks:
                h.remove()
        del loss
    known = [p for p in peaks if p is not None]
    return {
        "kind": kind,
        "model": model,
        "checkpoint": use_checkpoint,
        "device": device,
        "threads": threads,
        "steps": steps,
        "warmup": warmup,
        "step_times": times,
        "live_peak_bytes": max(known) if known else None,
        "live_peak_samples": peaks,
        "loss": first_loss,
        "block_input_bytes": sum(seen.values()),
        "torch": torch.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="One PyTorch eager configuration of benchmarks.compare_pytorch.")
    parser.add_argument("--model", required=True)
    parser.add_argument("--kind", choices=["time", "live"], required=True)
    parser.add_argument("--checkpoint", action="store_true", help="torch.utils.checkpoint per repeated block")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        result = run(
            args.model,
            kind=args.kind,
            use_checkpoint=args.checkpoint,
            steps=args.steps,
            warmup=args.warmup,
            device=args.device,
            threads=args.threads,
            seed=args.seed,
        )
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    print(json.dumps({"result": result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
