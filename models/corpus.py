"""A corpus of real architectures: Hugging Face ``transformers`` models built from small configs
with random weights (never a download), plus a dropout MLP, each with the exporters it goes
through.

``CORPUS`` maps a name (``<architecture>_<exporter>``) to a :class:`~models.ModelSpec`;
``python -m models.export --corpus [NAME ...] --out DIR`` writes their artifacts (tests use a
cache under ``.cache/corpus``). The architectures cover what users bring:

==============  ========================================================  ======================
architecture    what it exercises                                         exporters
==============  ========================================================  ======================
``gpt2``        decoder LM, tied input/output embedding, Conv1D, GELU      TorchScript 14, dynamo
``bert``        post-LayerNorm encoder (``LN(x + sublayer(x))``)           TorchScript 14, dynamo
``llama``       RMSNorm, rotary embeddings, gated SiLU MLP, GQA            TorchScript 17, dynamo
``t5``          encoder-decoder, cross-attention, relative position bias   TorchScript 17
``bart``        encoder-decoder, cross-attention, post-LN, learned pos.    TorchScript 17
``vit``         vision transformer (patch Conv, CLS token, pre-LN)         TorchScript 17, dynamo
``resnet``      CNN: conv stem with BatchNorm and max-pool, basic blocks   TorchScript 17
``gptneox``     parallel residual (attention and MLP off one input, each   TorchScript 17, dynamo
                ending in its dropout), partial rotary (25%)
``convnext``    depthwise 7x7 convolutions, channels-last LayerNorm,        TorchScript 17
                inverted MLP, layer scale, Sequential-held layers
``swin``        windowed attention with shifted windows, relative position  TorchScript 17
                bias, patch merging, dropout
``wav2vec2``    audio encoder: strided 1-D conv front end, grouped 1-D      TorchScript 17
                positional convolution (4 groups), post-LN layers, dropout
``mlp``         MLP with dropout (GELU, LayerNorm) and a residual          TorchScript 17, dynamo
==============  ========================================================  ======================

``transformers`` is pinned in ``pyproject.toml`` (``4.46.3``): newer releases build attention
masks with ``torch.vmap`` or ``aten::diff``, which the TorchScript exporter cannot export.
Every HF model is built with ``attn_implementation="eager"`` (attention as plain ops) and wrapped
so that ``forward`` returns one tensor: logits flattened to ``(N, classes)`` for
onnxruntime's ``CrossEntropyLoss`` (ONNX ``SoftmaxCrossEntropyLoss`` wants classes on axis 1).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from . import ModelSpec

SEED = 0


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class LogitsOnly(nn.Module):
    """Wraps a ``transformers`` model: ``forward(*inputs)`` -> logits as ``(N, classes)``.

    The wrapped model is the attribute ``model``, so module paths read ``model.<hf path>``.
    """

    def __init__(self, model: nn.Module, input_names: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.input_names = input_names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        kwargs = dict(zip(self.input_names, inputs))
        out = (
            self.model(**kwargs, use_cache=False, return_dict=False)
            if _takes_cache(self.model)
            else (self.model(**kwargs, return_dict=False))
        )
        logits = out[0]
        return logits.reshape(-1, logits.shape[-1])


def _takes_cache(model: nn.Module) -> bool:
    return bool(
        getattr(model.config, "is_decoder", False)
        or getattr(model.config, "is_encoder_decoder", False)
        or model.config.model_type in ("gpt2", "llama", "gpt_neox")
    )


class DropoutMLP(nn.Module):
    """``n`` residual blocks ``x + Dropout(Linear(GELU(Linear(LayerNorm(x)))))``, then a head."""

    def __init__(self, width: int = 256, hidden: int = 1024, n: int = 4, classes: int = 16, p: float = 0.2) -> None:
        super().__init__()
        self.inp = nn.Linear(64, width)
        self.blocks = nn.ModuleList(MLPBlock(width, hidden, p) for _ in range(n))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class MLPBlock(nn.Module):
    def __init__(self, width: int, hidden: int, p: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, hidden)
        self.act = nn.GELU()
        self.drop = nn.Dropout(p)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.drop(self.act(self.fc1(self.norm(x)))))


# -- builders -------------------------------------------------------------------------------

BATCH = 4
SEQ = 32
VOCAB = 512


def _hf(model_cls: str, config_cls: str, **config) -> Callable[[], nn.Module]:
    def build(input_names: tuple[str, ...]) -> nn.Module:
        import transformers

        torch.manual_seed(SEED)
        cfg = getattr(transformers, config_cls)(**config)
        cfg._attn_implementation = "eager"
        model = getattr(transformers, model_cls)(cfg)
        return LogitsOnly(model, input_names)

    return build


def _ids(seed: int, shape: tuple[int, ...], high: int = VOCAB) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=_seeded(seed))


def _ce(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output, target)


def _mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target)


def _arch(
    name: str,
    *,
    build,
    inputs,
    target,
    loss,
    ort_loss,
    input_names,
    block_scope,
    blocks,
    description,
    exporters: tuple[tuple[str, int], ...],
) -> list[ModelSpec]:
    specs = []
    for exporter, opset in exporters:
        specs.append(
            ModelSpec(
                name=f"{name}_{'ts' if exporter == 'torchscript' else 'dynamo'}",
                description=description,
                source="transformers 4.46.3, small config, random weights" if name != "mlp" else "models/corpus.py",
                build=functools.partial(build, input_names) if name != "mlp" else build,
                example_inputs=inputs,
                example_target=target,
                loss=loss,
                ort_loss=ort_loss,
                exporter=exporter,
                block_scope=block_scope,
                blocks=blocks,
                input_names=input_names,
                target_name="labels" if target is not None else None,
                opset=opset,
                slow=exporter == "dynamo",
            )
        )
    return specs


TS14, TS17, DYNAMO = ("torchscript", 14), ("torchscript", 17), ("dynamo", 18)

_SPECS: list[ModelSpec] = [
    *_arch(
        "gpt2",
        build=_hf("GPT2LMHeadModel", "GPT2Config", n_layer=4, n_embd=128, n_head=4, vocab_size=VOCAB, n_positions=SEQ),
        inputs=lambda: (_ids(1, (BATCH, SEQ)),),
        target=lambda: _ids(2, (BATCH * SEQ,)),
        loss=_ce,
        ort_loss="cross_entropy",
        input_names=("input_ids",),
        block_scope="GPT2Block",
        blocks=lambda m: list(m.model.transformer.h),
        description="GPT-2 decoder LM: 4 layers, width 128, 4 heads, tied embedding, seq 32, batch 4",
        exporters=(TS14, DYNAMO),
    ),
    *_arch(
        "bert",
        build=_hf(
            "BertForSequenceClassification",
            "BertConfig",
            num_hidden_layers=4,
            hidden_size=128,
            num_attention_heads=4,
            intermediate_size=512,
            vocab_size=VOCAB,
            max_position_embeddings=SEQ,
            num_labels=8,
        ),
        inputs=lambda: (_ids(1, (BATCH, SEQ)),),
        target=lambda: _ids(2, (BATCH,), 8),
        loss=_ce,
        ort_loss="cross_entropy",
        input_names=("input_ids",),
        block_scope="BertLayer",
        blocks=lambda m: list(m.model.bert.encoder.layer),
        description="BERT encoder (post-LayerNorm): 4 layers, width 128, classifier over 8 labels",
        exporters=(TS14, DYNAMO),
    ),
    *_arch(
        "llama",
        build=_hf(
            "LlamaForCausalLM",
            "LlamaConfig",
            num_hidden_layers=4,
            hidden_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=256,
            vocab_size=VOCAB,
            max_position_embeddings=SEQ,
        ),
        inputs=lambda: (_ids(1, (BATCH, SEQ)),),
        target=lambda: _ids(2, (BATCH * SEQ,)),
        loss=_ce,
        ort_loss="cross_entropy",
        input_names=("input_ids",),
        block_scope="LlamaDecoderLayer",
        blocks=lambda m: list(m.model.model.layers),
        description="Llama decoder LM: RMSNorm, rotary, gated SiLU MLP, 4 layers, width 128, GQA 4/2 heads",
        exporters=(TS17, DYNAMO),
    ),
    *_arch(
        "t5",
        build=_hf(
            "T5ForConditionalGeneration",
            "T5Config",
            num_layers=2,
            num_decoder_layers=2,
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_heads=4,
            vocab_size=VOCAB,
            decoder_start_token_id=0,
        ),
        inputs=lambda: (_ids(1, (BATCH, SEQ)), _ids(3, (BATCH, SEQ))),
        target=lambda: _ids(2, (BATCH * SEQ,)),
        loss=_ce,
        ort_loss="cross_entropy",
        input_names=("input_ids", "decoder_input_ids"),
        block_scope="T5Block",
        blocks=lambda m: [*m.model.encoder.block, *m.model.decoder.block],
        description="T5 encoder-decoder: 2+2 layers, width 64, cross-attention, relative position bias",
        exporters=(TS17,),
    ),
    *_arch(
        "bart",
        build=_hf(
            "BartForConditionalGeneration",
            "BartConfig",
            encoder_layers=2,
            decoder_layers=2,
            d_model=64,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            vocab_size=VOCAB,
            max_position_embeddings=SEQ,
        ),
        inputs=lambda: (_ids(1, (BATCH, SEQ)), _ids(3, (BATCH, SEQ))),
        target=lambda: _ids(2, (BATCH * SEQ,)),
        loss=_ce,
        ort_loss="cross_entropy",
        input_names=("input_ids", "decoder_input_ids"),
        block_scope="Bart*Layer",
        blocks=lambda m: [*m.model.model.encoder.layers, *m.model.model.decoder.layers],
        description="BART encoder-decoder: 2+2 post-LN layers, width 64, cross-attention, learned positions",
        exporters=(TS17,),
    ),
    *_arch(
        "vit",
        build=_hf(
            "ViTForImageClassification",
            "ViTConfig",
            image_size=32,
            patch_size=4,
            num_channels=3,
            hidden_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            intermediate_size=256,
            num_labels=10,
        ),
        inputs=lambda: (torch.randn(BATCH, 3, 32, 32, generator=_seeded(1)),),
        target=lambda: _ids(2, (BATCH,), 10),
        loss=_ce,
        ort_loss="cross_entropy",
        input_names=("pixel_values",),
        block_scope="ViTLayer",
        blocks=lambda m: list(m.model.vit.encoder.layer),
        description="ViT: 32x32 images, 4x4 patches, 4 pre-LN layers, width 128, 10 classes",
        exporters=(TS17, DYNAMO),
    ),
    *_arch(
        "resnet",
        build=_hf(
            "ResNetForImageClassification",
            "ResNetConfig",
            embedding_size=16,
            hidden_sizes=[16, 32, 64],
            depths=[2, 2, 2],
            layer_type="basic",
            num_labels=10,
        ),
        inputs=lambda: (torch.randn(8, 3, 64, 64, generator=_seeded(1)),),
        target=lambda: _ids(2, (8,), 10),
        loss=_ce,
        ort_loss="cross_entropy",
        input_names=("pixel_values",),
        block_scope="ResNetBasicLayer",
        blocks=lambda m: [b for s in m.model.resnet.encoder.stages for b in s.layers],
        description="ResNet (HF): conv7x7-BN-ReLU-maxpool stem, 3 stages x 2 basic blocks, 64x64 images",
        exporters=(TS17,),
    ),
    *_arch(
        "gptneox",
        build=_hf(
            "GPTNeoXForCausalLM",
            "GPTNeoXConfig",
            num_hidden_layers=4,
            hidden_size=256,
            num_attention_heads=4,
            intermediate_size=512,
            vocab_size=VOCAB,
            max_position_embeddings=SEQ,
            rotary_pct=0.25,
            use_parallel_residual=True,
            hidden_dropout=0.1,
            attention_dropout=0.1,
        ),
        inputs=lambda: (_ids(1, (BATCH, SEQ)),),
        target=lambda: _ids(2, (BATCH * SEQ,)),
        loss=_ce,
        ort_loss="cross_entropy",
        input_names=("input_ids",),
        block_scope="GPTNeoXLayer",
        blocks=lambda m: list(m.model.gpt_neox.layers),
        description="GPT-NeoX decoder LM: parallel residual (attention and MLP off one input, each with dropout), "
        "partial rotary (25%), 4 layers, width 256",
        exporters=(TS17, DYNAMO),
    ),
    *_arch(
        "convnext",
        build=_hf(
            "ConvNextForImageClassification",
            "ConvNextConfig",
            num_channels=3,
            patch_size=4,
            num_stages=2,
            hidden_sizes=[32, 64],
            depths=[2, 2],
            num_labels=10,
            image_size=32,
            drop_path_rate=0.0,
        ),
        inputs=lambda: (torch.randn(BATCH, 3, 32, 32, generator=_seeded(1)),),
        target=lambda: _ids(2, (BATCH,), 10),
        loss=_ce,
        ort_loss="cross_entropy",
        input_names=("pixel_values",),
        block_scope="ConvNextLayer",
        blocks=lambda m: [b for s in m.model.convnext.encoder.stages for b in s.layers],
        description="ConvNeXt: depthwise 7x7 convolutions, channels-last LayerNorm, inverted MLP, layer scale; "
        "2 stages x 2 layers, 32x32 images",
        exporters=(TS17,),
    ),
    *_arch(
        "swin",
        build=_hf(
            "SwinForImageClassification",
            "SwinConfig",
            image_size=32,
            patch_size=2,
            num_channels=3,
            embed_dim=32,
            depths=[2, 2],
            num_heads=[2, 4],
            window_size=4,
            num_labels=10,
            hidden_dropout_prob=0.1,
            attention_probs_dropout_prob=0.1,
            drop_path_rate=0.0,
        ),
        inputs=lambda: (torch.randn(BATCH, 3, 32, 32, generator=_seeded(1)),),
        target=lambda: _ids(2, (BATCH,), 10),
        loss=_ce,
        ort_loss="cross_entropy",
        input_names=("pixel_values",),
        block_scope="SwinLayer",
        blocks=lambda m: [b for s in m.model.swin.encoder.layers for b in s.blocks],
        description="Swin: windowed self-attention with shifted windows and relative position bias, patch merging; "
        "2 stages x 2 layers, dropout 0.1",
        exporters=(TS17,),
    ),
    *_arch(
        "wav2vec2",
        build=_hf(
            "Wav2Vec2ForSequenceClassification",
            "Wav2Vec2Config",
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            # GroupNorm exports as InstanceNormalization, which onnxruntime's gradient builder lacks;
            # the "layer" front end (LayerNorm after each conv) is the large models' own.
            feat_extract_norm="layer",
            conv_bias=True,
            conv_dim=(32, 32, 32),
            conv_stride=(5, 2, 2),
            conv_kernel=(10, 3, 3),
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4,
            num_labels=8,
            hidden_dropout=0.1,
            attention_dropout=0.1,
            activation_dropout=0.1,
            feat_proj_dropout=0.1,
            layerdrop=0.0,
            mask_time_prob=0.0,
            apply_spec_augment=False,
        ),
        inputs=lambda: (torch.randn(BATCH, 1600, generator=_seeded(1)),),
        target=lambda: _ids(2, (BATCH,), 8),
        loss=_ce,
        ort_loss="cross_entropy",
        input_names=("input_values",),
        block_scope="Wav2Vec2EncoderLayer",
        blocks=lambda m: list(m.model.wav2vec2.encoder.layers),
        description="wav2vec 2.0 audio encoder: strided conv feature extractor (LayerNorm), grouped conv positional "
        "embedding, 2 post-LN transformer layers with dropout; 1600 samples",
        exporters=(TS17,),
    ),
    *_arch(
        "mlp",
        build=lambda: (torch.manual_seed(SEED), DropoutMLP())[1],
        inputs=lambda: (torch.randn(512, 64, generator=_seeded(1)),),
        target=lambda: torch.randn(512, 16, generator=_seeded(2)),
        loss=_mse,
        ort_loss="mse",
        input_names=("x",),
        block_scope="MLPBlock",
        blocks=lambda m: list(m.blocks),
        description="MLP: 4 residual blocks LayerNorm-Linear-GELU-Dropout(0.2)-Linear, width 256/1024, MSE",
        exporters=(TS17, DYNAMO),
    ),
]

CORPUS: dict[str, ModelSpec] = {spec.name: spec for spec in _SPECS}

# GPT-2 at its real width (GPT-2 small: 12 layers, width 768, vocab 50257, tied input/output
# embedding), seq 64, batch 2: ~124 M parameters, ~500 MB of float32 in the checkpoint. Not in
# CORPUS (the tests' default run); `python -m models.export --corpus gpt2_small_ts` writes it, and
# the slow tests use it (tests/test_gpt2_small.py). Random weights, like the rest of the corpus.
GPT2_SMALL_SEQ, GPT2_SMALL_BATCH, GPT2_VOCAB = 64, 2, 50257
LARGE: dict[str, ModelSpec] = {
    "gpt2_small_ts": ModelSpec(
        name="gpt2_small_ts",
        description="GPT-2 small width: 12 layers, width 768, 12 heads, vocab 50257, tied embedding, seq 64, batch 2",
        source="transformers 4.46.3, GPT-2 small config, random weights",
        build=functools.partial(
            _hf("GPT2LMHeadModel", "GPT2Config", n_layer=12, n_embd=768, n_head=12, vocab_size=GPT2_VOCAB),
            ("input_ids",),
        ),
        example_inputs=lambda: (_ids(1, (GPT2_SMALL_BATCH, GPT2_SMALL_SEQ), GPT2_VOCAB),),
        example_target=lambda: _ids(2, (GPT2_SMALL_BATCH * GPT2_SMALL_SEQ,), GPT2_VOCAB),
        loss=_ce,
        ort_loss="cross_entropy",
        exporter="torchscript",
        block_scope="GPT2Block",
        blocks=lambda m: list(m.model.transformer.h),
        input_names=("input_ids",),
        target_name="labels",
        opset=14,
        slow=True,
    )
}

__all__ = ["CORPUS", "LARGE", "DropoutMLP", "LogitsOnly"]
