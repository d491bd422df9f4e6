"""The real-size graphs (models/realsize.py): slow, exported on first use into .cache/realsize
(minutes each), run with `make test-all` or `pytest -m slow tests/test_realsize.py`.

Each graph's default per-layer rewrite is bit-identical to the original on one step (loss and
every gradient, single-threaded where kernels race) and lowers onnxruntime's planned peak; on the
decoder LM with tied embeddings (GPT-2 small at sequence 1024) the defaults take at least 45% off
the planned peak, and training through Module + Optimizer over accumulated micro-batches gives
the original's losses and parameters bit for bit.
"""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("transformers")

import onnx_remat
from models.export import REALSIZE_OUT, export_artifacts
from models.realsize import REALSIZE
from onnx_remat.runtime.compare import compare

pytestmark = pytest.mark.slow


def _artifacts(name: str):
    art = REALSIZE_OUT / name
    if not (art / "training_model.onnx").exists():
        export_artifacts(REALSIZE[name], REALSIZE_OUT)
    return art


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("name", list(REALSIZE))
def test_the_default_per_layer_rewrite_is_bit_identical(name, tmp_path):
    art = _artifacts(name)
    result = onnx_remat.apply(art, scopes=REALSIZE[name].block_scope)
    c = compare(art, result.save(tmp_path / "remat"), steps=1, warmup=1, live=False)
    assert c.equal, (c.mismatched[:5], c.equality_run)
    assert c.b.planned_peak_bytes < c.a.planned_peak_bytes
    assert result.estimate_after.planned_peak_bytes == c.b.planned_peak_bytes


@pytest.mark.timeout(3600)
def test_gpt2_small_defaults_cut_45_percent_and_train_identically(tmp_path):
    """GPT-2 small at sequence 1024 (tied 50257 x 768 embedding): the defaults lose at least 45% of
    the planned peak, and 3 AdamW steps of 2 micro-batches each give the same losses and
    parameters bit for bit."""
    from training_steps import token_batches, train

    art = _artifacts("gpt2_small")
    result = onnx_remat.apply(art, scopes="GPT2Block")
    assert result.estimate_after.planned_peak_bytes <= 0.55 * result.estimate_before.planned_peak_bytes
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(art, a)
    result.save(b)
    batches = token_batches(REALSIZE["gpt2_small"], 6)
    losses_a, params_a = train(a, batches, micro_batches=2)
    losses_b, params_b = train(b, batches, micro_batches=2)
    assert losses_a == losses_b
    assert params_a.tobytes() == params_b.tobytes()
    assert len(set(losses_a)) > 1
