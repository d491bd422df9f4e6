"""A small ResNet for 32x32 images (the case of seed 001, MindSpore's recompute of ResNet-50
residual blocks), in PyTorch.

Stem ``conv3x3 -> BatchNorm -> ReLU``, then stages of :class:`BasicBlock` (``conv3x3 -> BN ->
ReLU -> conv3x3 -> BN``, plus the identity or a ``conv1x1 -> BN`` projection shortcut when the
shape changes, then ReLU), global average pooling and a linear classifier; cross-entropy loss
against integer class labels.

Defaults: batch 16, input ``3 x 32 x 32``, three stages of two blocks with widths 32/64/128
(strides 1/2/2), 10 classes.

BatchNorm in training mode (TorchScript exporter, onnxruntime-training 1.19.2), as measured:

* The export writes ``BatchNormalization`` with ``training_mode=1`` and three outputs (``Y``,
  running mean, running var); the running statistics are initializers named by module path
  (``stem.1.running_mean``). Tracing runs one train-mode forward, so the exported statistics are
  the updated ones and the module's buffers change: ``models.export`` restores both.
* ``generate_artifacts`` accepts it: the statistics are buffers, not parameters, so they stay
  constants in the graph; onnxruntime's training transformers replace each node by
  ``com.microsoft.BatchNormInternal`` named ``<node>_BatchNormInternal`` (batch statistics, as
  PyTorch's train mode) and the gradient goes through ``BatchNormalizationGrad``. The updated
  running statistics are dropped (no graph outputs, not in the checkpoint).
* ``eval_model.onnx`` as written does not load: ``generate_artifacts`` sets ``training_mode=0``
  and leaves the two running-statistics outputs, which onnxruntime refuses
  (``should be 1 when Training_mode = False``). ``onnx_remat.exporters.fix_eval_model`` drops
  them; the eval model then normalizes with the exported running statistics (mean 0, var 1).
* onnxruntime's gradients agree with PyTorch's to about 1.6e-3 relative (PyTorch float32 agrees
  with float64 to 3e-5), most likely because its CPU BatchNorm-gradient reductions lose
  precision where per-channel sums cancel (the error appears first in a BatchNorm bias gradient). The loss
  agrees to 1e-7.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

BATCH = 16
IMAGE = 32
WIDTHS = (32, 64, 128)
BLOCKS_PER_STAGE = 2
NUM_CLASSES = 10
SEED = 0


class ConvBN(nn.Module):
    """``conv -> BatchNorm`` (no bias in the conv)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))


class BasicBlock(nn.Module):
    """ResNet basic block: ``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = ConvBN(cin, cout, 1, stride) if stride != 1 or cin != cout else nn.Identity()
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + self.shortcut(x))


class ResNet(nn.Module):
    """Stem, ``len(widths)`` stages of ``blocks_per_stage`` :class:`BasicBlock`, pool, FC."""

    def __init__(
        self,
        widths: tuple[int, ...] = WIDTHS,
        blocks_per_stage: int = BLOCKS_PER_STAGE,
        num_classes: int = NUM_CLASSES,
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        stages = []
        cin = widths[0]
        for i, w in enumerate(widths):
            blocks = [BasicBlock(cin, w, stride=1 if i == 0 else 2)]
            blocks += [BasicBlock(w, w) for _ in range(blocks_per_stage - 1)]
            stages.append(nn.Sequential(*blocks))
            cin = w
        self.layers = nn.ModuleList(stages)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for stage in self.layers:
            x = stage(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


def build(seed: int = SEED) -> ResNet:
    """The network with its weights drawn under ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return ResNet()


def example_inputs(seed: int = SEED) -> tuple[torch.Tensor]:
    """``(images,)``: float32 ``BATCH x 3 x 32 x 32``, standard normal."""
    g = torch.Generator().manual_seed(seed + 1)
    return (torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g),)


def example_target(seed: int = SEED) -> torch.Tensor:
    """int64 class labels, ``BATCH``."""
    g = torch.Generator().manual_seed(seed + 2)
    return torch.randint(0, NUM_CLASSES, (BATCH,), generator=g)


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy, as onnxruntime's ``LossType.CrossEntropyLoss``."""
    return F.cross_entropy(output, target)
