"""The 5-block fully connected network of Paddle's ``recompute`` example (seed 002), in PyTorch.

The seed builds five blocks ``runfunc0`` .. ``runfunc4`` with ``get_fc_block``; each is a
``paddle.nn.Sequential`` of named sublayers::

    block_{i}_fc_0     Linear(n, n, bias_attr=False)
    block_{i}_dropout  Dropout(p=0.5)
    block_{i}_relu_1   ReLU
    block_{i}_fc_1     Linear(n, n, bias_attr=False)
    block_{i}_relu_2   ReLU
    block_{i}_fc_2     Linear(n, n, bias_attr=False)   (Linear(n, 1) in the last block)

Here each block is an :class:`FCBlock` (an ``nn.Sequential`` built from an ``OrderedDict`` with
the same sublayer names), so its parameters are ``runfunc0.block_0_fc_0.weight`` and so on, and
the class name ``FCBlock`` picks the repeated blocks. Paddle's ``Dropout`` default
(``upscale_in_train``) is what ``nn.Dropout`` does.

Loss: the seed's ``y_pred.mean()``. ``generate_artifacts`` takes it as a custom onnxblock loss
(``MeanLoss`` in :func:`models.export._ort_loss`: one ``ReduceMean`` over all axes), so the ONNX
training graph has no target input.

Sizes: the seed uses batch 1 and input size 10; here batch 2048 and input size 256, so the
activations (2 MiB per ``2048 x 256`` float tensor, about 10 per block) dominate the parameters
(15 matrices of ``256 x 256``: 3.7 MiB, the checkpoint). Input size 1024 would make the
checkpoint 60 MiB.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

BATCH = 2048
INPUT_SIZE = 256
N_BLOCKS = 5
SEED = 10  # the seed's paddle.seed(10)


class FCBlock(nn.Sequential):
    """One ``get_fc_block(block_idx, input_size, is_last)`` of the seed."""

    def __init__(self, block_idx: int, input_size: int, is_last: bool = False) -> None:
        name = f"block_{block_idx}"
        layers = OrderedDict(
            [
                (f"{name}_fc_0", nn.Linear(input_size, input_size, bias=False)),
                (f"{name}_dropout", nn.Dropout(p=0.5)),
                (f"{name}_relu_1", nn.ReLU()),
                (f"{name}_fc_1", nn.Linear(input_size, input_size, bias=False)),
                (f"{name}_relu_2", nn.ReLU()),
                (f"{name}_fc_2", nn.Linear(input_size, 1 if is_last else input_size, bias=False)),
            ]
        )
        super().__init__(layers)


class NaiveFcNet(nn.Module):
    """The seed's ``Naive_fc_net`` without its recompute switch: five :class:`FCBlock` in sequence."""

    def __init__(self, input_size: int = INPUT_SIZE, n_blocks: int = N_BLOCKS) -> None:
        super().__init__()
        self.n_blocks = n_blocks
        for i in range(n_blocks):
            self.add_module(f"runfunc{i}", FCBlock(i, input_size, is_last=i == n_blocks - 1))

    @property
    def total_func(self) -> list[FCBlock]:
        """The blocks in order (the seed's ``self.total_func``)."""
        return [getattr(self, f"runfunc{i}") for i in range(self.n_blocks)]

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        for block in self.total_func:
            inputs = block(inputs)
        return inputs


def build(seed: int = SEED) -> NaiveFcNet:
    """The network with its weights drawn under ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return NaiveFcNet()


def example_inputs(seed: int = SEED) -> tuple[torch.Tensor]:
    """``(x,)``: float32 ``BATCH x INPUT_SIZE``, uniform in [0, 1) like the seed's ``paddle.rand``."""
    g = torch.Generator().manual_seed(seed + 1)
    return (torch.rand(BATCH, INPUT_SIZE, generator=g),)


def example_target(seed: int = SEED) -> None:
    """The loss has no target (``y_pred.mean()``)."""
    return None


def loss(output: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
    """``output.mean()``, the seed's loss; ``target`` is ignored."""
    return output.mean()
