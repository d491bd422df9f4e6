"""Example PyTorch models for onnx-remat, from the seed documents, and their registry.

``MODELS`` maps a name to a :class:`ModelSpec`: how to build the (seeded) module, its example
inputs and loss target, the PyTorch loss that matches the ONNX one, the exporter, and which
repeated blocks to recompute. ``python -m models.export`` turns each entry into an
onnxruntime-training artifacts directory under ``models/artifacts/<name>/``.

=================  ==========================================================  =============
name               model                                                       exporter
=================  ==========================================================  =============
``blocks10``       MindSpore recompute tutorial's 10-Block network (seed 000)  TorchScript
``blocks10_dynamo`` the same network                                           dynamo
``fc5``            Paddle ``recompute`` example's 5-block FC net (seed 002)    TorchScript
``gpt``            small GPT-style decoder (per-layer recompute, seed 000)     TorchScript
``resnet``         small CIFAR-style ResNet (seed 001)                         TorchScript
=================  ==========================================================  =============
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from . import blocks10, fc5, gpt, resnet

ARTIFACTS_DIR_NAME = "artifacts"


@dataclass(frozen=True)
class ModelSpec:
    """One example model and everything needed to export, train and compare it.

    * ``build()``: the module, parameters drawn under a fixed seed (same values every call).
    * ``example_inputs()``: the model inputs (a tuple of tensors, fixed values).
    * ``example_target()``: the loss target (``None`` when the loss has none).
    * ``loss(output, target)``: the PyTorch loss, the same function as the ONNX loss block.
    * ``ort_loss``: the loss ``generate_artifacts`` adds: ``"mse"`` (``LossType.MSELoss``),
      ``"cross_entropy"`` (``LossType.CrossEntropyLoss``) or ``"mean"`` (``ReduceMean`` over all
      axes, a custom onnxblock).
    * ``exporter``: ``"torchscript"`` or ``"dynamo"``; ``opset``: default-domain opset written.
    * ``block_scope``: the scope pattern that selects one repeated block: a class name (matched
      against the ``pkg.torch.onnx.class_hierarchy`` of the nodes) or a module-path glob.
    * ``block_paths``: the module paths of the repeated blocks (``blocks.0`` ...), in order.
    * ``blocks(module)``: the repeated block modules, in order (to wrap each in
      ``torch.utils.checkpoint``).
    * ``input_names`` / ``output_names``: graph input and output names of the ONNX export;
      ``target_name``: the loss target's graph input in the training graph (``None``: none).
    * ``slow``: its export takes seconds (the dynamo exporter); tests re-export it only when
      slow tests are selected.
    """

    name: str
    description: str
    source: str
    build: Callable[[], nn.Module]
    example_inputs: Callable[[], tuple[torch.Tensor, ...]]
    example_target: Callable[[], torch.Tensor | None]
    loss: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]
    ort_loss: str
    exporter: str
    block_scope: str
    blocks: Callable[[nn.Module], list[nn.Module]]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...] = ("output",)
    target_name: str | None = None
    opset: int = 17
    slow: bool = False

    def block_paths(self, module: nn.Module | None = None) -> list[str]:
        """Module paths (``named_modules`` keys) of the repeated blocks, in order."""
        module = module if module is not None else self.build()
        by_id = {id(m): n for n, m in module.named_modules()}
        return [by_id[id(b)] for b in self.blocks(module)]


def _blocks10(dynamo: bool) -> ModelSpec:
    return ModelSpec(
        name="blocks10_dynamo" if dynamo else "blocks10",
        description=(
            "MindSpore recompute tutorial's network: 10 Blocks (scaled transposes, batched matmul, "
            "additive mask from an 8x128x128 parameter, softmax, dropout 0.1, batched matmul); "
            "x 8x128x16x32, MSE loss" + ("; exported with the dynamo exporter" if dynamo else "")
        ),
        source="seed 000 (MindSpore docs r2.5.0, recompute.md)",
        build=blocks10.build,
        example_inputs=blocks10.example_inputs,
        example_target=blocks10.example_target,
        loss=blocks10.loss,
        ort_loss="mse",
        exporter="dynamo" if dynamo else "torchscript",
        block_scope="Block",
        blocks=lambda m: list(m.blocks),
        input_names=("x",),
        target_name="target",
        opset=18 if dynamo else 17,
        slow=dynamo,
    )


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        _blocks10(dynamo=False),
        _blocks10(dynamo=True),
        ModelSpec(
            name="fc5",
            description=(
                "Paddle recompute example's network: 5 FC blocks runfunc0..4 (Linear, Dropout 0.5, "
                "ReLU, Linear, ReLU, Linear; no biases), batch 2048 x 256, loss output.mean()"
            ),
            source="seed 002 (paddle.distributed.fleet.utils.recompute)",
            build=fc5.build,
            example_inputs=fc5.example_inputs,
            example_target=fc5.example_target,
            loss=fc5.loss,
            ort_loss="mean",
            exporter="torchscript",
            block_scope="FCBlock",
            blocks=lambda m: list(m.total_func),
            input_names=("inputs",),
            target_name=None,
        ),
        ModelSpec(
            name="gpt",
            description=(
                "GPT-style decoder: 4 pre-LayerNorm Blocks (causal self-attention, GELU MLP, "
                "dropout 0.1), width 128, 4 heads, seq 128, batch 8, vocab 512; cross-entropy"
            ),
            source="seed 000 (per-layer recompute of GPT-3 in MindSpore)",
            build=gpt.build,
            example_inputs=gpt.example_inputs,
            example_target=gpt.example_target,
            loss=gpt.loss,
            ort_loss="cross_entropy",
            exporter="torchscript",
            block_scope="Block",
            blocks=lambda m: list(m.blocks),
            input_names=("idx",),
            target_name="labels",
        ),
        ModelSpec(
            name="resnet",
            description=(
                "small ResNet: conv-BN-ReLU stem, 3 stages x 2 BasicBlocks (widths 32/64/128), "
                "global pool, FC; batch 16 x 3x32x32, 10 classes, cross-entropy"
            ),
            source="seed 001 (MindSpore docs r1.6, apply_recompute.md, ResNet)",
            build=resnet.build,
            example_inputs=resnet.example_inputs,
            example_target=resnet.example_target,
            loss=resnet.loss,
            ort_loss="cross_entropy",
            exporter="torchscript",
            block_scope="BasicBlock",
            blocks=lambda m: [b for stage in m.layers for b in stage],
            input_names=("images",),
            target_name="labels",
        ),
    )
}

__all__ = ["ARTIFACTS_DIR_NAME", "MODELS", "ModelSpec"]
