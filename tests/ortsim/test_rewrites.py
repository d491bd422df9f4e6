"""Each emulated onnxruntime rewrite (onnx_remat/ortsim/rewrites/) against onnxruntime itself: a
small graph the rewrite applies to, optimized by the emulation and by an onnxruntime session
(``optimized_model_filepath``); the unit must have fired, and both graphs must hold the same
nodes (op types and domains, as a multiset) and produce the output from the same op."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.ortsim.emulation import emulate
from onnx_remat.ortsim.graph import node_io, runtime_graph
from onnx_remat.ortsim.optimizer import LEVEL1, LEVEL2, optimize
from onnx_remat.ortsim.shapes import infer_runtime_shapes

ort = pytest.importorskip("onnxruntime")

F = TensorProto.FLOAT


def _vi(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    imports = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=imports, ir_version=8)


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)


CASES = {
    "EliminateIdentity": _model(
        [helper.make_node("Identity", ["x"], ["i"]), helper.make_node("Relu", ["i"], ["y"])],
        [_vi("x", [4, 8])],
        [_vi("y", [4, 8])],
    ),
    "CastElimination": _model(
        [helper.make_node("Cast", ["x"], ["c"], to=F), helper.make_node("Relu", ["c"], ["y"])],
        [_vi("x", [4, 8])],
        [_vi("y", [4, 8])],
    ),
    "NoopElimination": _model(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Add", ["r", "zero"], ["a"]),
            helper.make_node("Sigmoid", ["a"], ["y"]),
        ],
        [_vi("x", [4, 8])],
        [_vi("y", [4, 8])],
        [_const("zero", 0.0)],
    ),
    "GemmTransposeFusion": _model(
        [helper.make_node("Transpose", ["a"], ["at"], perm=[1, 0]), helper.make_node("Gemm", ["at", "b"], ["y"])],
        [_vi("a", [8, 4]), _vi("b", [8, 6])],
        [_vi("y", [4, 6])],
    ),
    "GemmSumFusion": _model(
        [helper.make_node("Gemm", ["a", "b"], ["g"]), helper.make_node("Sum", ["g", "c"], ["y"])],
        [_vi("a", [4, 8]), _vi("b", [8, 6]), _vi("c", [4, 6])],
        [_vi("y", [4, 6])],
    ),
    "ConstantSharing": _model(
        [
            helper.make_node("Mul", ["x", "two_a"], ["m1"]),
            helper.make_node("Mul", ["x2", "two_b"], ["m2"]),
            helper.make_node("Add", ["m1", "m2"], ["y"]),
        ],
        [_vi("x", [4, 8]), _vi("x2", [4, 8])],
        [_vi("y", [4, 8])],
        [_const("two_a", [2.0]), _const("two_b", [2.0])],
    ),
    "CommonSubexpressionElimination": _model(
        [
            helper.make_node("Relu", ["x"], ["r1"]),
            helper.make_node("Relu", ["x"], ["r2"]),
            helper.make_node("Add", ["r1", "r2"], ["y"]),
        ],
        [_vi("x", [4, 8])],
        [_vi("y", [4, 8])],
    ),
    "ConstantFolding": _model(
        [helper.make_node("Add", ["c1", "c2"], ["c"]), helper.make_node("Mul", ["x", "c"], ["y"])],
        [_vi("x", [4, 8])],
        [_vi("y", [4, 8])],
        [
            numpy_helper.from_array(np.ones((4, 8), np.float32), "c1"),
            numpy_helper.from_array(np.full((4, 8), 2.0, np.float32), "c2"),
        ],
    ),
    "TransposeOptimizer": _model(
        [
            helper.make_node("Transpose", ["x"], ["t1"], perm=[0, 2, 1]),
            helper.make_node("Relu", ["t1"], ["r"]),
            helper.make_node("Transpose", ["r"], ["t2"], perm=[0, 2, 1]),
            helper.make_node("Sigmoid", ["t2"], ["y"]),
        ],
        [_vi("x", [2, 4, 8])],
        [_vi("y", [2, 4, 8])],
    ),
    "MatmulTransposeFusion": _model(
        [helper.make_node("Transpose", ["b"], ["bt"], perm=[0, 2, 1]), helper.make_node("MatMul", ["a", "bt"], ["y"])],
        [_vi("a", [2, 4, 8]), _vi("b", [2, 6, 8])],
        [_vi("y", [2, 4, 6])],
    ),
    "MatMulScaleFusion": _model(
        [helper.make_node("Mul", ["a", "half"], ["s"]), helper.make_node("MatMul", ["s", "b"], ["y"])],
        [_vi("a", [4, 8]), _vi("b", [8, 6])],
        [_vi("y", [4, 6])],
        [_const("half", 0.5)],
    ),
}


def _emulated(model: onnx.ModelProto):
    sizes = TensorSizes(model)
    infer_runtime_shapes(model, sizes)
    rg = optimize(runtime_graph(model, sizes))
    return rg


def _onnxruntime(model: onnx.ModelProto, tmp_path) -> onnx.ModelProto:
    so = ort.SessionOptions()
    # Levels 1 and 2 are what the emulation covers; level 3 (NCHWc layouts) is hardware-specific.
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return onnx.load(str(tmp_path / "opt.onnx"))


def _histogram(pairs) -> Counter:
    return Counter(("" if d in ("", "ai.onnx") else d, op) for d, op in pairs)


def test_every_unit_has_a_case():
    units = {p.name for level in (LEVEL1, LEVEL2) for p in level if not p.name.endswith("RuleBasedTransformer")}
    rules = {r.name for level in (LEVEL1, LEVEL2) for p in level for r in getattr(p, "rules", [])}
    assert units | rules == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rewrite_matches_onnxruntime(name, tmp_path):
    model = CASES[name]
    rg = _emulated(model)
    assert rg.rewrites[name] > 0, dict(rg.rewrites)
    emulated = _histogram((n.domain, n.op) for n in rg.live())
    optimized = _onnxruntime(model, tmp_path)
    real = _histogram((n.domain, n.op_type) for n in optimized.graph.node)
    assert emulated == real, (dict(emulated), dict(real))
    out = model.graph.output[0].name
    made_by = {o: n.op for n in rg.live() for o in n.outputs}
    real_made_by = {o: n.op_type for n in optimized.graph.node for o in n.output}
    assert made_by.get(out) == real_made_by.get(out)


def test_noop_on_a_graph_input_is_kept(tmp_path):
    """onnxruntime does not remove ``x + 0`` when ``x`` is a graph input; nor does the emulation."""
    model = _model(
        [helper.make_node("Add", ["x", "zero"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
        [_vi("x", [4, 8])],
        [_vi("y", [4, 8])],
        [_const("zero", 0.0)],
    )
    rg = _emulated(model)
    assert rg.rewrites["NoopElimination"] == 0
    assert _histogram((n.domain, n.op) for n in rg.live()) == _histogram(
        (n.domain, n.op_type) for n in _onnxruntime(model, tmp_path).graph.node
    )


# An Identity that writes a graph output: its producer takes the output over (EliminateIdentity's
# second form, which renames the producer's output).
_IDENTITY_TO_OUTPUT = _model(
    [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["y"])],
    [_vi("x", [4, 8])],
    [_vi("y", [4, 8])],
)


@pytest.mark.parametrize("name", [*sorted(CASES), "identity to output"])
def test_no_rewrite_changes_the_node_lists_it_read(name):
    """Every rewrite gives an edited node new input and output lists: the lists the graph was read
    from stay as read (the emulation keeps them, Emulation.io, and the memory schedule's written
    graphs read theirs from them), while the emulated graph is the same as from lists of its own."""
    model = CASES.get(name, _IDENTITY_TO_OUTPUT)
    sizes = TensorSizes(model)
    io = node_io(model)
    e = emulate(model, sizes, io=io)
    assert e.io is io and io == node_io(model)
    assert sum(e.rg.rewrites.values()) > 0
    alone = emulate(model, sizes)
    assert [(n.op, n.inputs, n.outputs) for n in e.rg.live()] == [(n.op, n.inputs, n.outputs) for n in alone.rg.live()]
