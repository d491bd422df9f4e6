"""Training a graph for several steps through ``onnxruntime.training.api``, for tests that compare a
rewrite with its original over accumulated micro-batches and optimizer steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def train(artifacts: Path, batches, *, micro_batches: int) -> tuple[list[float], np.ndarray]:
    """Losses of every micro-batch and the parameters after the last optimizer step, training
    ``artifacts`` with ``onnxruntime.training.api`` (single-threaded: GatherGrad races with two)."""
    from onnx_remat.runtime.step_peak import training_api

    module, optimizer = training_api(artifacts, threads=1)
    losses = []
    for k, batch in enumerate(batches):
        losses.append(float(np.asarray(module(*batch))))
        if (k + 1) % micro_batches == 0:
            optimizer.step()
            module.lazy_reset_grad()
    return losses, module.get_contiguous_parameters().numpy().copy()


def token_batches(spec, count: int, seed: int = 7) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` batches shaped like ``spec``'s example inputs and target, other token ids each."""
    ids, target = spec.example_inputs()[0].numpy(), spec.example_target().numpy()
    vocab = int(max(ids.max(), target.max())) + 1
    rng = np.random.default_rng(seed)
    return [
        (rng.integers(0, vocab, ids.shape, dtype=np.int64), rng.integers(0, vocab, target.shape, dtype=np.int64))
        for _ in range(count)
    ]
