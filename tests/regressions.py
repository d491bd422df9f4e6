"""Small PyTorch modules that once broke the rewrite, each the minimal form of a failure found by
the corpus or the fuzzer (benchmarks/fuzz.py), and a helper that makes their artifacts.

* :class:`PostNormNet`: ``LN(x + Linear(x))`` per block (BERT's shape). After the rewrite the
  residual Add had only the LayerNorm as reader and onnxruntime fused the two into
  ``SkipLayerNormalization``, which drops the mean the gradient reads: the step failed.
* :class:`ChannelNormNet`: a per-channel scale, then BatchNorm over the transposed sequence (fuzz
  model 111). Recomputing the Transposes changed where onnxruntime's TransposeOptimizer moved
  them, and a weight gradient came out summed in another order (1e-16 off).
* :class:`TanhNormNet`: BatchNorm over the transposed sequence and Tanh, repeated (fuzz model
  148): a fence between Tanh and the next Transpose kept the TransposeOptimizer from cancelling
  Transposes, and the planned peak rose.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


class PostNorm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(x + self.fc(x))


class PostNormNet(nn.Module):
    def __init__(self, width: int = 64, blocks: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(PostNorm(width) for _ in range(blocks))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


class ChannelNorm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(width)

    def forward(self, x):
        return self.bn(x.transpose(1, 2)).transpose(1, 2)


class Scale(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(width) + 0.5)

    def forward(self, x):
        return x * self.weight


class Mixer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.scale = Scale(width)
        self.norm1 = ChannelNorm(width)
        self.norm2 = ChannelNorm(width)

    def forward(self, x):
        x = self.norm1(self.scale(x))
        return x + self.norm2(torch.softmax(x, dim=-1))


class ChannelNormNet(nn.Module):
    def __init__(self, width: int = 64, blocks: int = 2) -> None:
        super().__init__()
        self.embed = nn.Linear(width, width)
        self.blocks = nn.ModuleList(Mixer(width) for _ in range(blocks))

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return x


class TanhNorm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = ChannelNorm(width)

    def forward(self, x):
        return torch.tanh(self.norm(x))


class TanhNormNet(nn.Module):
    def __init__(self, width: int = 96, blocks: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(width, width)
        self.blocks = nn.ModuleList(TanhNorm(width) for _ in range(blocks))
        self.head = nn.Linear(width, width, bias=False)

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def make_artifacts(
    module: nn.Module, x: torch.Tensor, out: Path, *, exporter: str = "torchscript", opset: int = 17, loss: str = "mean"
) -> Path:
    """Export ``module`` on input ``x`` and write its training artifacts into ``out`` (created)."""
    from onnx_remat.exporters import export_for_training, trainable_parameter_names
    from onnx_remat.runtime.artifacts import generate_training_artifacts

    torch.manual_seed(0)
    model = export_for_training(module, (x,), exporter=exporter, opset=opset, input_names=["x"])
    out.mkdir(parents=True, exist_ok=True)
    generate_training_artifacts(
        model, out, requires_grad=trainable_parameter_names(model, module, strict=True), loss=loss
    )
    return out
