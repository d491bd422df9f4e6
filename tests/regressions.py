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
* :class:`ParallelNet`: GPT-NeoX's parallel residual, ``x + Dropout(attn(LN1(x))) +
  Dropout(mlp(LN2(x)))`` with a dropout inside the attention too: two sibling branches off one
  input, each holding random ops. onnxruntime's DEFAULT order runs the branch later in the node
  list first, so the draw order differs from the node-list order; the random-op pins, placed right
  before each random op, broke the node list's topological order (an internal error on every
  apply of GPT-NeoX).
* :class:`DropResidualNet`: ``Dropout(x) + Dropout(Linear(x))``: random ops in both branches of a
  residual.
* :class:`ConvBranchNet`: ``c + Conv(Dropout(c))`` with ``c`` a biased convolution (fuzz model
  5129). ``c``'s convolution has two readers in the original; its clone, recomputed for an
  ``Add`` without the Dropout (whose output is stored), had one, and onnxruntime fused it with
  the ``Add`` into a ``FusedConv``, which rounds differently: a weight gradient came out 3.7e-9
  off.
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


class Branch(nn.Module):
    """A branch of a parallel block: Linear, softmax over features, dropout, Linear."""

    def __init__(self, width: int, p: float) -> None:
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.drop = nn.Dropout(p)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        return self.out(self.drop(torch.softmax(self.inp(x), dim=-1)))


class ParallelBlock(nn.Module):
    def __init__(self, width: int, p: float = 0.1) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.ln2 = nn.LayerNorm(width)
        self.attn = Branch(width, p)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
        self.attn_drop = nn.Dropout(p)
        self.mlp_drop = nn.Dropout(p)

    def forward(self, x):
        return x + self.attn_drop(self.attn(self.ln1(x))) + self.mlp_drop(self.mlp(self.ln2(x)))


class ParallelNet(nn.Module):
    def __init__(self, width: int = 64, blocks: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(width, width)
        self.blocks = nn.ModuleList(ParallelBlock(width) for _ in range(blocks))

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return x


class DropResidual(nn.Module):
    def __init__(self, width: int, p: float = 0.2) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.skip_drop = nn.Dropout(p)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return self.skip_drop(x) + self.drop(torch.relu(self.fc(x)))


class DropResidualNet(nn.Module):
    def __init__(self, width: int = 64, blocks: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(DropResidual(width) for _ in range(blocks))
        self.head = nn.Linear(width, width)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


class ConvBranch(nn.Module):
    def __init__(self, width: int, p: float = 0.1) -> None:
        super().__init__()
        self.proj = nn.Conv2d(width, width, 1)
        self.drop = nn.Dropout(p)
        self.conv = nn.Conv2d(width, width, 3, padding=1, bias=False)

    def forward(self, x):
        c = self.proj(x)
        return x + (c + self.conv(self.drop(c)))


class ConvBranchNet(nn.Module):
    def __init__(self, width: int = 8, blocks: int = 2) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(ConvBranch(width) for _ in range(blocks))
        self.mix = nn.ModuleList(nn.Conv2d(width, width, 3, padding=1) for _ in range(blocks))

    def forward(self, x):
        for b, m in zip(self.blocks, self.mix):
            x = m(b(x))
        return x


CALLS = 3


class Layer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


class SharedLayer(nn.Module):
    """ALBERT's pattern: one layer instance run CALLS times, between a stem and a head of their own."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Linear(width, width)
        self.layer = Layer(width)
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        x = self.stem(x)
        for _ in range(CALLS):
            x = self.layer(x)
        return self.head(x)


class Recurrent(nn.Module):
    """A cell run once per time step (``STEPS``) from a hidden state of zeros, between an input
    projection and a head: ``cell`` is ``"lstm"`` or ``"gru"``."""

    def __init__(self, cell: str, width: int = 16) -> None:
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.cell = nn.LSTMCell(width, width) if cell == "lstm" else nn.GRUCell(width, width)
        self.head = nn.Linear(width, 4)
        self.width = width

    def forward(self, x):
        x = self.inp(x)
        h = torch.zeros(x.shape[0], self.width)
        c = torch.zeros(x.shape[0], self.width)
        for t in range(STEPS):
            if isinstance(self.cell, nn.LSTMCell):
                h, c = self.cell(x[:, t], (h, c))
            else:
                h = self.cell(x[:, t], h)
        return self.head(h)


STEPS = 4


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
