"""Real-size training graphs: the models that run out of memory, at their published widths.

``REALSIZE`` maps a name to a :class:`~models.ModelSpec`: Hugging Face ``transformers`` models
(pinned, see ``models/corpus.py``) built from the published configurations with random weights
(never a download), at sequence lengths and batches that fit one training step on a 24 GiB,
2-core machine:

================  ==========================================================  ===============
name              model                                                       parameters
================  ==========================================================  ===============
``gpt2_small``    GPT-2 small: 12 x 768, 12 heads, vocab 50257, tied           124 M
                  embedding; sequence 1024, batch 1
``gpt2_medium``   GPT-2 medium: 24 x 1024, 16 heads, tied embedding;           355 M
                  sequence 512, batch 1
``bert_base``     BERT-base: 12 x 768, 12 heads, FFN 3072, vocab 30522;        109 M
                  sequence 512, batch 1, 2-way classifier
``llama_2048``    Llama-shaped decoder: width 2048, 16 heads, GQA with 4 KV    311 M
                  heads, SwiGLU 5632, vocab 32000, 4 layers; sequence 512,
                  batch 1
``vit_b16``       ViT-B/16: 224 x 224, 16 x 16 patches, 12 x 768; batch 4      86 M
``resnet50``      ResNet-50 (bottleneck 3-4-6-3); 224 x 224, batch 8           26 M
================  ==========================================================  ===============

All go through the TorchScript exporter (opset 14 for GPT-2 and BERT, 17 for the rest, as in the
corpus). GPT-2 small, BERT-base and ViT-B/16 (:data:`DYNAMO_TOO`) go through the dynamo exporter
too, as ``<name>_dynamo`` (opset 18, with the corpus's export fixes,
:func:`onnx_remat.exporters.fix_dynamo_training_export`), so that both exporters' graphs are
measured at real size; a dynamo graph and its TorchScript twin are one PyTorch module, whose peers
are measured once. The Llama-shaped decoder has 4 layers: its parameters (1.2 GB as fp32) are then
below protobuf's 2 GB limit for the exported forward model, which ``generate_artifacts`` needs in
one piece; each layer is 45 M parameters, the layers are alike, and the per-layer results scale with
their number. Dropout is as each configuration has it (0.1 for GPT-2, BERT; none for Llama,
ViT-B/16's default 0.0, ResNet).

``python -m models.export --realsize [NAME ...]`` writes their artifacts under
``.cache/realsize`` (not committed; minutes per model). The benchmark that measures them beside
PyTorch is ``python -m benchmarks.realsize``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from . import ModelSpec
from .corpus import SEED, LogitsOnly


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _hf(model_cls: str, config_cls: str, **config) -> Callable[[tuple[str, ...]], nn.Module]:
    """A builder of ``transformers.<model_cls>`` from ``<config_cls>(**config)``, seeded, with
    attention as plain ops (``eager``), wrapped to return flattened logits (:class:`LogitsOnly`)."""

    def build(input_names: tuple[str, ...]) -> nn.Module:
        import transformers

        torch.manual_seed(SEED)
        cfg = getattr(transformers, config_cls)(**config)
        cfg._attn_implementation = "eager"
        return LogitsOnly(getattr(transformers, model_cls)(cfg), input_names)

    return build


def _ids(seed: int, shape: tuple[int, ...], high: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=_seeded(seed))


def _ce(output: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
    assert target is not None
    return F.cross_entropy(output, target)


def _spec(
    name: str,
    *,
    build: Callable[[tuple[str, ...]], nn.Module],
    input_names: tuple[str, ...],
    inputs: Callable[[], tuple[torch.Tensor, ...]],
    target: Callable[[], torch.Tensor],
    block_scope: str,
    blocks: Callable[[nn.Module], list[nn.Module]],
    description: str,
    opset: int,
) -> ModelSpec:
    return ModelSpec(
        name=name,
        description=description,
        source="transformers 4.46.3, published configuration, random weights",
        build=functools.partial(build, input_names),
        example_inputs=inputs,
        example_target=target,
        loss=_ce,
        ort_loss="cross_entropy",
        exporter="torchscript",
        block_scope=block_scope,
        blocks=blocks,
        input_names=input_names,
        target_name="labels",
        opset=opset,
        slow=True,
    )


GPT2_VOCAB = 50257
# Also exported by dynamo (``<name>_dynamo``): both exporters' graphs measured at real size.
DYNAMO_TOO = ("gpt2_small", "bert_base", "vit_b16")


def _gpt2(name: str, layers: int, width: int, heads: int, seq: int, description: str) -> ModelSpec:
    return _spec(
        name,
        build=_hf("GPT2LMHeadModel", "GPT2Config", n_layer=layers, n_embd=width, n_head=heads, vocab_size=GPT2_VOCAB),
        input_names=("input_ids",),
        inputs=lambda: (_ids(1, (1, seq), GPT2_VOCAB),),
        target=lambda: _ids(2, (seq,), GPT2_VOCAB),
        block_scope="GPT2Block",
        blocks=lambda m: list(m.model.transformer.h),
        description=description,
        opset=14,
    )


_SPECS = [
    _gpt2(
        "gpt2_small",
        12,
        768,
        12,
        1024,
        "GPT-2 small: 12 layers x 768, 12 heads, vocab 50257, tied embedding; sequence 1024, batch 1",
    ),
    _gpt2(
        "gpt2_medium",
        24,
        1024,
        16,
        512,
        "GPT-2 medium: 24 layers x 1024, 16 heads, vocab 50257, tied embedding; sequence 512, batch 1",
    ),
    _spec(
        "bert_base",
        build=_hf(
            "BertForSequenceClassification",
            "BertConfig",
            num_hidden_layers=12,
            hidden_size=768,
            num_attention_heads=12,
            intermediate_size=3072,
            vocab_size=30522,
            num_labels=2,
        ),
        input_names=("input_ids",),
        inputs=lambda: (_ids(1, (1, 512), 30522),),
        target=lambda: _ids(2, (1,), 2),
        block_scope="BertLayer",
        blocks=lambda m: list(m.model.bert.encoder.layer),
        description="BERT-base: 12 layers x 768, 12 heads, FFN 3072, vocab 30522; sequence 512, batch 1, 2 labels",
        opset=14,
    ),
    _spec(
        "llama_2048",
        build=_hf(
            "LlamaForCausalLM",
            "LlamaConfig",
            num_hidden_layers=4,
            hidden_size=2048,
            num_attention_heads=16,
            num_key_value_heads=4,
            intermediate_size=5632,
            vocab_size=32000,
            max_position_embeddings=2048,
        ),
        input_names=("input_ids",),
        inputs=lambda: (_ids(1, (1, 512), 32000),),
        target=lambda: _ids(2, (512,), 32000),
        block_scope="LlamaDecoderLayer",
        blocks=lambda m: list(m.model.model.layers),
        description=(
            "Llama-shaped decoder: width 2048, 16 heads, GQA 4 KV heads, SwiGLU 5632, vocab 32000, "
            "4 layers; sequence 512, batch 1"
        ),
        opset=17,
    ),
    _spec(
        "vit_b16",
        build=_hf(
            "ViTForImageClassification",
            "ViTConfig",
            image_size=224,
            patch_size=16,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            num_labels=1000,
        ),
        input_names=("pixel_values",),
        inputs=lambda: (torch.randn(4, 3, 224, 224, generator=_seeded(1)),),
        target=lambda: _ids(2, (4,), 1000),
        block_scope="ViTLayer",
        blocks=lambda m: list(m.model.vit.encoder.layer),
        description="ViT-B/16: 224x224 images, 16x16 patches, 12 layers x 768, 1000 classes; batch 4",
        opset=17,
    ),
    _spec(
        "resnet50",
        build=_hf(
            "ResNetForImageClassification",
            "ResNetConfig",
            embedding_size=64,
            hidden_sizes=[256, 512, 1024, 2048],
            depths=[3, 4, 6, 3],
            layer_type="bottleneck",
            num_labels=1000,
        ),
        input_names=("pixel_values",),
        inputs=lambda: (torch.randn(8, 3, 224, 224, generator=_seeded(1)),),
        target=lambda: _ids(2, (8,), 1000),
        block_scope="ResNetBottleNeckLayer",
        blocks=lambda m: [b for s in m.model.resnet.encoder.stages for b in s.layers],
        description="ResNet-50: bottleneck stages 3-4-6-3, 224x224 images, 1000 classes; batch 8",
        opset=17,
    ),
]


def _through_dynamo(spec: ModelSpec) -> ModelSpec:
    """``spec`` exported by dynamo (opset 18) instead: the same module, inputs and loss."""
    return dataclasses.replace(
        spec,
        name=f"{spec.name}_dynamo",
        description=f"{spec.name} through the dynamo exporter (opset 18): the same module, inputs and loss",
        exporter="dynamo",
        opset=18,
    )


_SPECS += [_through_dynamo(spec) for spec in _SPECS if spec.name in DYNAMO_TOO]

REALSIZE: dict[str, ModelSpec] = {spec.name: spec for spec in _SPECS}

__all__ = ["REALSIZE"]
