"""The 10-Block network of the MindSpore recompute tutorial (seed 000), in PyTorch.

Each :class:`Block` is the seed's ``Block`` cell: two scaled transposes of the input, a batched
matmul (attention-like scores), an additive mask computed from the parameter ``y``, softmax,
dropout (MindSpore ``keep_prob=0.9`` is ``p=0.1`` here) and a second batched matmul against the
input. :class:`Net` applies ten of them in sequence (the seed's ``nn.CellList``).

Input ``x``: float32 ``8 x 128 x 16 x 32``; loss: MSE against a target of the same shape.
"""

from __future__ import annotations

import torch
from torch import nn

BATCH, SEQ, HEADS, DIM = 8, 128, 16, 32
N_BLOCKS = 10
SEED = 0


class Block(nn.Module):
    """One seed ``Block``: ``(softmax((1 - y) * -1e-4 + (x' / c) @ (x'' / c)) -> dropout) @ x'``."""

    def __init__(self, batch: int = BATCH, seq: int = SEQ) -> None:
        super().__init__()
        self.y = nn.Parameter(torch.ones(batch, seq, seq))
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t1 = x.permute(0, 2, 1, 3) / 2.37891
        t2 = x.permute(0, 2, 3, 1) / 2.37891
        b1 = torch.matmul(t1, t2)
        m = (1.0 - self.y.unsqueeze(1)) * -0.0001
        s = torch.softmax(m + b1, -1)
        d = self.drop(s)
        return torch.matmul(d, x.permute(0, 2, 1, 3)).permute(0, 2, 1, 3)


class Net(nn.Module):
    """Ten :class:`Block` in sequence (``self.blocks`` is an ``nn.ModuleList``)."""

    def __init__(self, n_blocks: int = N_BLOCKS, batch: int = BATCH, seq: int = SEQ) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(batch, seq) for _ in range(n_blocks)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def build(seed: int = SEED) -> Net:
    """The network, its parameters made under ``torch.manual_seed(seed)`` (all ones anyway)."""
    torch.manual_seed(seed)
    return Net()


def example_inputs(seed: int = SEED) -> tuple[torch.Tensor]:
    """``(x,)``: float32 ``8 x 128 x 16 x 32`` drawn from a seeded generator."""
    g = torch.Generator().manual_seed(seed + 1)
    return (torch.rand(BATCH, SEQ, HEADS, DIM, generator=g),)


def example_target(seed: int = SEED) -> torch.Tensor:
    """MSE target, the shape of the output."""
    g = torch.Generator().manual_seed(seed + 2)
    return torch.rand(BATCH, SEQ, HEADS, DIM, generator=g)


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error, as onnxruntime's ``LossType.MSELoss``."""
    return torch.mean((output - target) ** 2)
