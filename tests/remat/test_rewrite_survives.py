"""The rewrite survives onnxruntime's own graph rewrites: each class of failure the corpus and the
fuzzer found, on its minimal model (tests/regressions.py), with the mechanism that fixes it
switched off to show it is what makes the difference."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from regressions import ChannelNormNet, ConvBranchNet, PostNormNet, TanhNormNet, make_artifacts

import onnx_remat
from onnx_remat.analysis.model import ModelAnalysis, analyze_model
from onnx_remat.errors import RematError
from onnx_remat.graph import tags
from onnx_remat.model_io import write_artifacts
from onnx_remat.remat.apply import plan
from onnx_remat.remat.rewrite import RecomputeRewrite
from onnx_remat.runtime.compare import compare


def _rewrite(src, out, selection, **options):
    """The rewrite with ``options`` (RecomputeRewrite's switches), written as artifacts to ``out``."""
    analysis = analyze_model(src)
    result = RecomputeRewrite(**options)(analysis.graph, plan(analysis, **selection))
    return write_artifacts(src, out, result.model), result


@pytest.fixture(scope="module")
def postnorm(tmp_path_factory):
    torch.manual_seed(0)
    x = torch.randn(4, 32, 64)
    # opset 14: the LayerNormalization is onnxruntime's own op, which onnx.checker refuses
    return make_artifacts(PostNormNet(), x, tmp_path_factory.mktemp("postnorm"), opset=14)


def test_post_layernorm_blocks_run_bit_identical(postnorm, tmp_path):
    result = onnx_remat.apply(postnorm, scopes="blocks.*")
    assert result.rewrite.fences  # the residual Adds are fenced from their LayerNorms
    out = result.save(tmp_path / "remat")
    c = compare(postnorm, out, steps=1, live=False)
    assert c.equal and c.b.planned_peak_bytes < c.a.planned_peak_bytes


def test_without_fences_onnxruntime_fuses_and_the_step_fails(postnorm, tmp_path):
    out, _ = _rewrite(postnorm, tmp_path / "nofence", {"scopes": "blocks.*"}, fence=False)
    with pytest.raises(RematError, match="LayerNormalizationGrad.*Missing Input"):
        compare(postnorm, out, steps=1, live=False)


def test_clones_are_fused_as_their_originals_were(tmp_path, monkeypatch):
    """Fuzz model 5129: the biased convolution before a Dropout has two readers; recomputed for
    the residual Adds it had one, and onnxruntime fused the clone with its Add (a ``FusedConv``
    that rounds differently). Its clone's edge is fenced, and the gradients are bit-identical;
    without the fences they are not."""
    torch.manual_seed(3)
    src = make_artifacts(ConvBranchNet(), torch.randn(2, 8, 12, 12), tmp_path / "m")
    result = onnx_remat.apply(src, op_types=["Add"])
    clone_fences = [f for f in result.rewrite.fences if "/remat" in f]
    assert clone_fences, result.rewrite.fences
    assert compare(src, result.save(tmp_path / "remat"), steps=1, live=False).equal
    monkeypatch.setattr(RecomputeRewrite, "_fence_clones", lambda self, *a: [])
    out, raw = _rewrite(src, tmp_path / "unfenced", {"op_types": ["Add"]})
    assert not any("/remat" in f for f in raw.fences)
    assert not compare(src, out, steps=1, live=False).equal


def _fuzz_artifacts(seed: int, out):
    """The artifacts of the fuzzer's model ``seed`` (benchmarks/fuzz.py), as the fuzzer makes them."""
    from benchmarks.fuzz import build, draw_model
    from onnx_remat.exporters import export_for_training, trainable_parameter_names
    from onnx_remat.runtime.artifacts import generate_training_artifacts

    spec = draw_model(seed)
    module, args, _ = build(spec)
    model = export_for_training(module, args, exporter=spec.exporter, opset=spec.opset, input_names=["x"])
    out.mkdir(parents=True)
    generate_training_artifacts(
        model, out, requires_grad=trainable_parameter_names(model, module, strict=True), loss=spec.loss
    )
    return out


def test_nothing_next_to_a_transpose_onnxruntime_moves_is_recomputed(tmp_path, monkeypatch):
    """Fuzz model 5169: onnxruntime pushes a Transpose through a GELU's element-wise ops (and the
    gradient ops after them) until it cancels. Recomputing the GELU put the segment's barrier
    among the readers of a tensor in that chain, where no Transpose is pushed through, and a
    weight gradient came out 3.7e-9 off. The planner asks the emulation which Transposes
    onnxruntime moves and recomputes nothing they are pushed into."""
    src = _fuzz_artifacts(5169, tmp_path / "m")
    analysis = analyze_model(src)
    moved = analysis.moved_transposes([n for n in analysis.graph.order if n.op == "Transpose"])
    assert moved and len(moved) < sum(n.op == "Transpose" for n in analysis.graph.order)
    import onnx_remat.ortsim.emulation as emulation

    emulated = []
    real = emulation.emulate
    monkeypatch.setattr(emulation, "emulate", lambda model, *a, **k: emulated.append(model) or real(model, *a, **k))
    analysis = analyze_model(src)
    result = onnx_remat.apply(analysis, scopes="Cell")
    assert sum(m is analysis.model for m in emulated) == 1  # the planner's question and the peak check share it
    assert compare(src, result.save(tmp_path / "remat"), steps=1, live=False).equal
    monkeypatch.setattr(ModelAnalysis, "moved_transposes", lambda self, transposes: set())
    unruled = onnx_remat.apply(src, scopes="Cell")
    assert sum(len(s.clones) for s in unruled.rewrite.segments) > sum(len(s.clones) for s in result.rewrite.segments)
    assert not compare(src, unruled.save(tmp_path / "unruled"), steps=1, live=False).equal


def test_random_ops_run_in_the_original_order(corpus, tmp_path):
    """BART, rewritten without the schedule: the rewrite alone runs the decoder's embedding dropout
    before the encoder's, which then draws the encoder's mask; the pins that ``apply`` adds where
    the emulated order changes make loss and gradients bit-identical."""
    src = corpus("bart_ts")
    pinned = onnx_remat.apply(src, scopes="Bart*Layer", schedule=False)
    assert pinned.rewrite.random_order_pins
    assert compare(src, pinned.save(tmp_path / "pinned"), steps=1, live=False).equal
    out, raw = _rewrite(src, tmp_path / "unpinned", {"scopes": "Bart*Layer"})
    assert not raw.random_order_pins  # the rewrite itself pins nothing
    assert not compare(src, out, steps=1, live=False).equal


def test_transposes_next_to_elementwise_ops_stay_stored(tmp_path):
    """Fuzz model 111: recomputing the Transposes around a BatchNorm changed the TransposeOptimizer's
    layout choice and a weight gradient's summation order."""
    torch.manual_seed(1)
    src = make_artifacts(ChannelNormNet(), torch.randn(4, 32, 64), tmp_path / "m")
    analysis = analyze_model(src)
    p = plan(analysis, scopes="Mixer")
    assert not any(n.op == "Transpose" for s in p.segments for n in s.recompute)
    result = onnx_remat.apply(src, scopes="Mixer") if p.segments else None
    if result is not None:
        assert compare(src, result.save(tmp_path / "remat"), steps=1, live=False).equal
    # The old behaviour: Transposes recomputed, not bit-identical.
    import onnx_remat.remat.plan as selection

    planner = selection.Planner(analysis.graph, analysis.scopes, analysis.sizes)
    planner._layout_free = lambda node: True
    naive = RecomputeRewrite()(analysis.graph, planner.plan(selection.Selection(scopes=["Mixer"])))
    out = write_artifacts(src, tmp_path / "naive", naive.model)
    assert not compare(src, out, steps=1, live=False).equal


def test_batchnorm_clones_leave_running_statistics_alone(tmp_path):
    """A cloned BatchNormInternal would update the running statistics a second time (its kernel
    writes them in place): its statistics inputs are scratch buffers."""
    from conftest import artifacts_dir

    result = onnx_remat.apply(artifacts_dir("resnet"), scopes="BasicBlock")
    nodes = {n.name: n for n in result.model.graph.node}
    bn_clones = [n for n in result.model.graph.node if n.op_type == "BatchNormInternal" and tags.is_clone_name(n.name)]
    assert bn_clones
    originals = {n.name: n for n in result.analysis.model.graph.node}
    for clone in bn_clones:
        source = originals[tags.original_name(clone.name)]
        for i in (3, 4):
            scratch = next(n for n in nodes.values() if clone.input[i] in n.output)
            assert scratch.op_type == "Mul" and source.input[i] not in clone.input


def test_nodes_reading_an_overwritten_tensor_are_not_recomputed(synthetic_dir):
    analysis = analyze_model(synthetic_dir)
    import onnx_remat.remat.plan as selection

    planner = selection.Planner(analysis.graph, analysis.scopes, analysis.sizes)
    some = next(n for n in analysis.graph.forward_nodes if n.op == "MatMul")
    planner._written[some.inputs[0].name] = -1  # pretend another node writes its input in place
    assert not planner.cloneable(some)


def test_a_rewrite_that_would_raise_the_peak_is_not_written(tmp_path, monkeypatch):
    """Fuzz model 148: the rewrite keeps Transposes that onnxruntime cancels in the original graph,
    and its peak rose. The planner now recomputes nothing next to a Transpose onnxruntime moves
    (fuzz model 5169); with that rule off, apply skips the segments whose recompute raises the
    estimated peak, and what it writes, if anything, does not raise the measured one."""
    torch.manual_seed(2)
    src = make_artifacts(TanhNormNet(), torch.randn(8, 64, 96), tmp_path / "m", exporter="dynamo", opset=18)
    with pytest.raises(RematError, match="nothing to recompute.*next to a Transpose"):
        onnx_remat.apply(src, scopes="blocks.*")
    monkeypatch.setattr(ModelAnalysis, "moved_transposes", lambda self, transposes: set())
    try:
        result = onnx_remat.apply(src, scopes="blocks.*")
    except RematError as exc:
        assert "nothing to recompute" in str(exc) and "raise the estimated planned peak" in str(exc)
        return
    c = compare(src, result.save(tmp_path / "remat"), steps=1, live=False)
    assert c.equal and c.b.planned_peak_bytes <= c.a.planned_peak_bytes
