"""In-place gradient accumulation: what each mode writes, and its bits in onnxruntime.

The graphs are a parameter gradient as ``generate_artifacts`` writes one for a weight with
several readers: partial gradients, their ``Sum`` (``AccumulateGrad_w_grad``) and the parameter's
``InPlaceAccumulatorV2`` into ``w_grad.accumulation.buffer``.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.graph import tags
from onnx_remat.ortsim.graph import runtime_graph
from onnx_remat.ortsim.optimizer import optimize
from onnx_remat.ortsim.shapes import infer_runtime_shapes
from onnx_remat.scheduling.accumulate import accumulate_gradients

BUFFER = "w_grad.accumulation.buffer"
M, N = 24, 40


def _vi(name, shape, et=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, et, shape)


def _model(nodes, inputs, partials):
    nodes = [
        *nodes,
        helper.make_node("Sum", partials, ["w_grad"], name="AccumulateGrad_w_grad"),
        helper.make_node(
            "InPlaceAccumulatorV2",
            [BUFFER, "w_grad", "lazy_reset_grad"],
            ["w_grad.accumulation.out"],
            name="GradientAccumulator0",
            domain="com.microsoft",
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [*inputs, _vi(BUFFER, [M, N]), _vi("lazy_reset_grad", [1], TensorProto.BOOL)],
        [_vi("w_grad.accumulation.out", [1], TensorProto.BOOL)],
    )
    imports = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=imports, ir_version=9)


def three_partials():
    """Three partials, none fused by onnxruntime: Sum(p0, p1, p2)."""
    nodes = [
        helper.make_node("MatMul", ["a", "b"], ["w_grad_0"], name="mm"),
        helper.make_node("Mul", ["c", "d"], ["w_grad_1"], name="mul"),
        helper.make_node("Sigmoid", ["c"], ["w_grad_2"], name="sig"),
    ]
    inputs = [_vi("a", [M, 16]), _vi("b", [16, N]), _vi("c", [M, N]), _vi("d", [M, N])]
    return _model(nodes, inputs, ["w_grad_0", "w_grad_1", "w_grad_2"])


def gemm_plus_partial(k=300):
    """Sum(Gemm(A^T, B), X): onnxruntime fuses it into Gemm(A^T, B, C=X) (GemmSumFusion), as it does
    the tied embedding's gradient; k above the CPU kernel's block, where splitting changes bits."""
    nodes = [
        helper.make_node("Gemm", ["A", "B"], ["w_grad_0"], name="gemm", transA=1),
        helper.make_node("Mul", ["c", "d"], ["w_grad_1"], name="mul"),
    ]
    inputs = [_vi("A", [k, M]), _vi("B", [k, N]), _vi("c", [M, N]), _vi("d", [M, N])]
    return _model(nodes, inputs, ["w_grad_0", "w_grad_1"])


def _accumulate(model, mode):
    sizes = TensorSizes(model)
    infer_runtime_shapes(model, sizes)
    rg = optimize(runtime_graph(model, sizes))
    return accumulate_gradients(model, rg, rg.default_order(), mode)


def _run(model, feeds, reset):
    """The gradient buffer after one run (onnxruntime writes the fed array in place)."""
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    run_feeds = {k: v.copy() for k, v in feeds.items()}
    run_feeds["lazy_reset_grad"] = np.array([reset])
    run_feeds.setdefault("ids", np.arange(40, dtype=np.int64).reshape(4, 10) % M)
    sess.run(None, {i.name: run_feeds[i.name] for i in sess.get_inputs()})
    return run_feeds[BUFFER]


def _feeds(model, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        if vi.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        # magnitudes over six decades, so that the order of additions shows in the last bits
        feeds[vi.name] = (rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3, shape)).astype(np.float32)
    return feeds


def _bits_equal(x, y):
    return x.shape == y.shape and bool((x.view(np.int32) == y.view(np.int32)).all())


def test_inplace_mode_adds_into_the_first_partial_in_the_sums_order():
    model = three_partials()
    result = _accumulate(model, "inplace")
    (acc,) = result.gradients
    assert acc.parameter == "w" and acc.mode == "inplace"
    ops = [(n.op_type, list(n.input)) for n in result.model.graph.node]
    assert ("Sum", ["w_grad_0", "w_grad_1", "w_grad_2"]) not in ops
    chain = [n for n in result.model.graph.node if n.op_type == "InPlaceAccumulator"]
    assert [list(n.input)[1] for n in chain] == acc.partials[1:] and len(chain) == 2
    assert chain[-1].output[0] == "w_grad"  # the accumulator reads the same tensor as before
    assert all(tags.is_accumulate_name(n.name) for n in chain)
    assert [n.name for n in model.graph.node].count("AccumulateGrad_w_grad") == 1  # input unchanged


@pytest.mark.parametrize("reset", [True, False])
def test_inplace_mode_is_bit_identical_with_and_without_reset(reset):
    model = three_partials()
    feeds = _feeds(model)
    before = _run(model, feeds, reset)
    after = _run(_accumulate(model, "inplace").model, feeds, reset)
    assert _bits_equal(before, after)


def test_early_mode_accumulates_each_partial_into_the_buffer():
    result = _accumulate(three_partials(), "early")
    (acc,) = result.gradients
    nodes = list(result.model.graph.node)
    steps = [n for n in nodes if n.op_type == "InPlaceAccumulatorV2"]
    assert [n.input[1] for n in steps] == acc.partials
    assert steps[0].input[0] == BUFFER and list(steps[0].input[2:]) == ["lazy_reset_grad"]
    assert all(len(s.input) == 2 for s in steps[1:])  # later ones add: no reset
    assert steps[-1].name == "GradientAccumulator0" and list(steps[-1].output) == ["w_grad.accumulation.out"]
    assert not any(n.op_type == "Sum" for n in nodes)
    # each intermediate step has an anchor, a leaf the scheduler can rank early
    anchors = [n for n in nodes if n.op_type == "PassThrough"]
    assert [a.input[0] for a in anchors] == [s.output[0] for s in steps[:-1]]


def test_early_mode_is_bit_identical_with_reset_and_rounds_differently_across_steps():
    model = three_partials()
    early = _accumulate(model, "early").model
    feeds = _feeds(model)
    assert _bits_equal(_run(model, feeds, True), _run(early, feeds, True))
    # Accumulating into gradients of an earlier step: (b + p0) + p1 + p2, not b + (p0 + p1 + p2).
    kept, changed = _run(model, feeds, False), _run(early, feeds, False)
    assert not _bits_equal(kept, changed)
    assert np.allclose(kept, changed, rtol=1e-5, atol=1e-5 * float(np.abs(kept).max()))


def test_a_sum_onnxruntime_fuses_into_a_gemm():
    model = gemm_plus_partial()
    inplace = _accumulate(model, "inplace")
    assert inplace.gradients == [] and inplace.model is model
    assert inplace.skipped == [
        ("w", "onnxruntime fuses its sum into a Gemm: kept as written (its C is not an embedding's GatherGrad)")
    ]
    early = _accumulate(model, "early")
    (acc,) = early.gradients
    assert acc.fused_gemm and acc.partials == ["w_grad_1", "w_grad_0"]  # the Gemm's C first
    feeds = _feeds(model)
    # The Gemm adds the buffer (holding the other partial) as its C: the fused kernel's own
    # rounding, so bit-identical with reset gradients although k = 300 ...
    assert _bits_equal(_run(model, feeds, True), _run(early.model, feeds, True))
    # ... where adding the Gemm's result afterwards (what a plain split would do) is not.
    split = onnx.ModelProto()
    split.CopyFrom(model)
    for n in split.graph.node:
        if n.op_type == "Sum":
            n.op_type = "Add"  # Gemm + Add: no GemmSumFusion (it matches Sum only)
    assert not _bits_equal(_run(model, feeds, True), _run(split, feeds, True))


def tied_embedding(k=300, tokens=40):
    """The tied embedding's gradient: Sum(Gemm(dY^T, H), GatherGrad(shape(w), ids, dE)), which
    onnxruntime fuses into Gemm(dY^T, H, C=GatherGrad(...)); ids repeat, k above the kernel's block."""
    nodes = [
        helper.make_node("Gemm", ["A", "B"], ["w_grad_0"], name="gemm", transA=1),
        helper.make_node("Shape", ["w"], ["w_shape"], name="shape"),
        helper.make_node(
            "GatherGrad", ["w_shape", "ids", "dE"], ["w_grad_1"], name="gather_grad", domain="com.microsoft"
        ),
    ]
    inputs = [
        _vi("A", [k, M]),
        _vi("B", [k, N]),
        _vi("w", [M, N]),
        _vi("ids", [4, tokens // 4], TensorProto.INT64),
        _vi("dE", [4, tokens // 4, N]),
    ]
    model = _model(nodes, inputs, ["w_grad_0", "w_grad_1"])
    model.graph.value_info.append(_vi("w_grad_1", [M, N]))  # as generate_artifacts declares gradients
    return model


def test_the_tied_embeddings_fused_gemm_is_accumulated_in_place_exactly():
    """The Gemm's rows where C is zero go into the buffer at once, the rows of the ids that occur
    are the fused Gemm's own (C restricted to them), added last: the same bits, reset or not."""
    model = tied_embedding()
    result = _accumulate(model, "inplace")
    (acc,) = result.gradients
    assert acc.parameter == "w" and acc.mode == "inplace" and acc.fused_gemm
    ops = [n.op_type for n in result.model.graph.node]
    assert "Sum" not in ops and ops.count("InPlaceAccumulatorV2") == 2 and "Unique" in ops
    assert not any(n.name in ("gemm", "gather_grad") for n in result.model.graph.node)  # dead partials removed
    rng = np.random.default_rng(3)
    feeds = _feeds(model)
    feeds["ids"] = rng.integers(0, M // 2, (4, 10)).astype(np.int64)  # repeated ids, half the rows untouched
    for reset in (True, False):
        assert _bits_equal(_run(model, feeds, reset), _run(result.model, feeds, reset)), reset


def test_sum_mode_and_shared_partials_leave_the_graph_alone():
    model = three_partials()
    assert _accumulate(model, "sum").model is model
    shared = onnx.ModelProto()
    shared.CopyFrom(model)
    shared.graph.node.append(helper.make_node("Relu", ["w_grad_0"], ["r"], name="other_reader"))
    shared.graph.node.append(helper.make_node("Relu", ["w_grad_1"], ["r1"], name="other_reader1"))
    result = _accumulate(shared, "inplace")
    assert result.gradients == [] and "owns its buffer" in result.skipped[0][1]
    # early mode does not write into partials: other readers do not matter
    assert len(_accumulate(shared, "early").gradients) == 1
