"""The tied embedding's gradient, accumulated in place exactly (scheduling/accumulate.py,
``_sparse_gemm_chain``): onnxruntime fuses the LM head's weight gradient and the embedding's
``GatherGrad`` into one Gemm, whose two parameter-sized inputs and output decided GPT-2's peak.

Checked against onnxruntime-training on the graph it runs: one step bit for bit, and training
through ``onnxruntime.training.api`` (``Module`` + ``Optimizer``, AdamW) over several accumulated
micro-batches and optimizer steps with identical losses and parameters."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from training_steps import token_batches, train

from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.model_io import load_model, write_artifacts
from onnx_remat.ortsim.emulation import emulate
from onnx_remat.runtime.compare import compare
from onnx_remat.scheduling.accumulate import accumulate_gradients

TIED = "model.transformer.wte.weight"


def _accumulated(src: Path, out: Path) -> tuple[Path, list]:
    """``src``'s artifacts with the tied gradient accumulated in place (nothing else changed)."""
    model = load_model(src).model
    emu = emulate(model, TensorSizes(model))
    result = accumulate_gradients(model, emu.rg, emu.order, "inplace")
    return write_artifacts(src, out, result.model), result.gradients


@pytest.fixture(scope="module", params=["gpt2_ts", "gpt2_dynamo"])
def tied(request, corpus, tmp_path_factory):
    src = corpus(request.param)
    out, gradients = _accumulated(src, tmp_path_factory.mktemp(request.param) / "accumulated")
    return src, out, gradients


def test_the_fused_lm_head_gradient_is_split_and_no_dense_partial_is_kept(tied):
    src, out, gradients = tied
    tied_grads = [g for g in gradients if g.fused_gemm]
    assert len(tied_grads) == 1 and tied_grads[0].mode == "inplace"
    # TorchScript names the tied parameter after the input embedding, dynamo after the LM head
    assert tied_grads[0].parameter in (TIED, "model.lm_head.weight")
    tied_name = tied_grads[0].parameter
    written = load_model(out).model
    ops = {n.op_type for n in written.graph.node}
    assert {"Unique", "GatherGrad", "Gemm"} <= ops
    # the gradient builder's Sum of the two partials is gone, and so are the partials' producers
    assert not any(n.op_type == "Sum" and tied_name in n.output[0] for n in written.graph.node)
    assert not any(o == f"{tied_name}_grad_0" for n in written.graph.node for o in n.output)
    before = emulate(load_model(src).model, TensorSizes(load_model(src).model))
    after = emulate(written, TensorSizes(written))
    assert after.planned_peak_bytes <= before.planned_peak_bytes


def test_one_step_is_bit_identical_and_the_estimate_exact(tied):
    src, out, _ = tied
    c = compare(src, out, steps=1, warmup=1, live=False)
    assert c.equal, (c.mismatched[:5], c.equality_run)
    written = load_model(out).model
    assert emulate(written, TensorSizes(written)).planned_peak_bytes == c.b.planned_peak_bytes


def test_training_over_micro_batches_and_optimizer_steps_is_identical(tied, tmp_path):
    """2 micro-batches per optimizer step (the second adds to the gradient buffer the first reset),
    3 steps of AdamW: every loss and every parameter bit for bit."""
    from models.corpus import CORPUS

    src, out, _ = tied
    # the artifacts' own copies: Module and Optimizer read the eval and optimizer models beside them
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(src, a)
    shutil.copytree(out, b)
    batches = token_batches(CORPUS["gpt2_ts"], 6)
    losses_a, params_a = train(a, batches, micro_batches=2)
    losses_b, params_b = train(b, batches, micro_batches=2)
    assert losses_a == losses_b
    assert params_a.tobytes() == params_b.tobytes()
    assert len(set(losses_a)) > 1  # the parameters moved: the steps trained
