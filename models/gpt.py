"""A small GPT-style decoder (pre-LayerNorm transformer), the usual target of per-layer
recomputation (seed 000 mentions MindSpore recomputing each GPT-3 layer).

Token embedding + learned positions, ``n_layer`` :class:`Block` (``x + attn(ln_1(x))``,
``x + mlp(ln_2(x))``; causal self-attention with attention and residual dropout, GELU MLP with
dropout), final LayerNorm and a linear LM head. Cross-entropy over token ids.

``forward`` returns the logits flattened to ``(batch * seq, vocab)``: onnxruntime's
``CrossEntropyLoss`` block is ONNX ``SoftmaxCrossEntropyLoss``, which wants the classes on axis 1,
and its labels are then the ``(batch * seq,)`` next-token ids.

Defaults (fast on 2 CPU cores): 4 layers, width 128, 4 heads, sequence 128, batch 8, vocab 512.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

SEED = 0


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of the model and of its example batch."""

    n_layer: int = 4
    n_embd: int = 128
    n_head: int = 4
    block_size: int = 128  # sequence length
    vocab_size: int = 512
    batch: int = 8
    dropout: float = 0.1


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention written out (matmul, mask, softmax, dropout, matmul)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.attn_drop = nn.Dropout(cfg.dropout)
        self.resid_drop = nn.Dropout(cfg.dropout)
        t = cfg.block_size
        self.register_buffer("mask", torch.tril(torch.ones(t, t, dtype=torch.bool)).view(1, 1, t, t), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        h = self.n_head
        q = q.view(b, t, h, c // h).transpose(1, 2)
        k = k.view(b, t, h, c // h).transpose(1, 2)
        v = v.view(b, t, h, c // h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // h))
        att = att.masked_fill(~self.mask[:, :, :t, :t], float("-inf"))
        att = self.attn_drop(torch.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    """``Linear(4c) -> GELU -> Linear(c) -> Dropout``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer layer."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Embeddings, ``n_layer`` :class:`Block` in ``self.blocks``, final LayerNorm, LM head."""

    def __init__(self, cfg: GPTConfig = GPTConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.register_buffer("pos", torch.arange(cfg.block_size).unsqueeze(0), persistent=False)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, mean=0.0, std=0.02)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        b, t = idx.shape
        x = self.drop(self.wte(idx) + self.wpe(self.pos[:, :t]))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits.reshape(b * t, logits.shape[-1])


def build(seed: int = SEED, cfg: GPTConfig = GPTConfig()) -> GPT:
    """The model with its weights drawn under ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return GPT(cfg)


def example_inputs(seed: int = SEED, cfg: GPTConfig = GPTConfig()) -> tuple[torch.Tensor]:
    """``(idx,)``: int64 token ids ``batch x block_size``."""
    g = torch.Generator().manual_seed(seed + 1)
    return (torch.randint(0, cfg.vocab_size, (cfg.batch, cfg.block_size), generator=g),)


def example_target(seed: int = SEED, cfg: GPTConfig = GPTConfig()) -> torch.Tensor:
    """int64 next-token labels, flattened to ``batch * block_size``."""
    g = torch.Generator().manual_seed(seed + 2)
    return torch.randint(0, cfg.vocab_size, (cfg.batch * cfg.block_size,), generator=g)


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy, as onnxruntime's ``LossType.CrossEntropyLoss``."""
    return F.cross_entropy(output, target)
