"""The corpus of real architectures (models/corpus.py): every model loads, and per-layer recompute
runs in onnxruntime-training with loss and gradients bit-identical and a lower planned peak."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import onnx_remat
from models.corpus import CORPUS
from onnx_remat.graph import tags
from onnx_remat.runtime.compare import compare

NAMES = list(CORPUS)


def test_corpus_covers_what_users_bring():
    archs = {name.rsplit("_", 1)[0] for name in NAMES}
    assert len(archs) >= 8
    assert {"gpt2", "bert", "llama", "t5", "bart", "vit", "resnet", "mlp"} <= archs
    dynamo = {name.rsplit("_", 1)[0] for name in NAMES if name.endswith("_dynamo")}
    assert len(dynamo) >= 3 and "gpt2" in dynamo  # the decoder LM through both exporters


@pytest.mark.parametrize("name", NAMES)
def test_per_layer_recompute_is_exact_and_lowers_the_peak(name, corpus, tmp_path):
    spec = CORPUS[name]
    src = corpus(name)
    result = onnx_remat.apply(src, scopes=spec.block_scope)
    blocks = len(spec.blocks(spec.build()))
    assert len(result.rewrite.segments) == blocks, [s.label for s in result.rewrite.segments]
    assert result.estimate_after.planned_peak_bytes < result.estimate_before.planned_peak_bytes
    if len(result.plan.masks) > 1:  # with dropout: masks packed to bits (the default) and still bit-identical
        assert result.dropout == "packed" and result.rewrite.packed_masks
        assert result.mask_bytes < sum(result.analysis.sizes.nbytes(m) or 0 for m in result.plan.masks)
    out = result.save(tmp_path / "remat")
    c = compare(src, out, steps=1, warmup=1, live=False)
    assert c.equal, (c.mismatched[:5], c.equality_run)
    assert c.b.planned_peak_bytes < c.a.planned_peak_bytes
    kept = c.b.rewrite
    assert kept is not None and kept.barriers_kept == blocks
    assert kept.clones_kept > 0 and kept.all_late
    # What the rewrite added to keep onnxruntime from fusing or reordering survives its optimizer.
    names = {n.name for n in result.model.graph.node}
    assert {f for f in result.rewrite.fences} <= names
    assert all(tags.is_fence_name(f) for f in result.rewrite.fences)
