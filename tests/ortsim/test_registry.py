"""Validity is what onnxruntime-training 1.19 loads (onnx_remat.ortsim.registry, onnx_remat.ortsim.ops_table)."""

from __future__ import annotations

import onnx
import pytest
from conftest import artifacts_dir, assert_one_line_error
from onnx import TensorProto, helper

from onnx_remat.errors import RematError
from onnx_remat.model_io import load_model
from onnx_remat.ortsim import ops_table as ort_ops
from onnx_remat.ortsim.registry import check_runtime_support, runtime_only


def _model(nodes, *, opset=17, ir=8, extra_imports=(), inputs=("x",), outputs=("y",)) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 4]) for n in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 4]) for n in outputs],
        initializer=[
            helper.make_tensor("scale", TensorProto.FLOAT, [4], [1.0] * 4),
            helper.make_tensor("bias", TensorProto.FLOAT, [4], [0.0] * 4),
        ],
    )
    imports = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in extra_imports)]
    return helper.make_model(graph, opset_imports=imports, ir_version=ir)


def test_onnxruntime_default_domain_ops_are_valid():
    # LayerNormalization before ONNX defined it (opset 17) is onnxruntime's own; onnx.checker refuses it.
    ln14 = _model([helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"], axis=-1)], opset=14)
    with pytest.raises(onnx.checker.ValidationError, match="No Op registered for LayerNormalization"):
        onnx.checker.check_model(ln14)
    check_runtime_support(ln14)
    rms = _model([helper.make_node("SimplifiedLayerNormalization", ["x", "scale"], ["y"], axis=-1)], opset=17)
    check_runtime_support(rms)
    assert runtime_only("MaxPoolGrad", 17) and runtime_only("LayerNormalization", 16)
    assert not runtime_only("LayerNormalization", 17) and not runtime_only("Relu", 17)


def test_structure_is_still_checked_around_onnxruntime_ops():
    # An ONNX op with a wrong attribute next to an onnxruntime op: the checker still sees it.
    bad = _model(
        [
            helper.make_node("SimplifiedLayerNormalization", ["x", "scale"], ["t"], axis=-1),
            helper.make_node("Softmax", ["t"], ["y"], axis="wrong"),
        ]
    )
    with pytest.raises(RematError, match="invalid ONNX model"):
        check_runtime_support(bad, "m.onnx")
    undefined = _model([helper.make_node("Relu", ["nowhere"], ["y"])])
    with pytest.raises(RematError, match="nowhere"):
        check_runtime_support(undefined)


@pytest.mark.parametrize(
    "model, fragment",
    [
        (_model([helper.make_node("Relu", ["x"], ["y"])], ir=11), "IR version 11 is newer than onnxruntime 1.19 loads"),
        (_model([helper.make_node("Relu", ["x"], ["y"])], opset=22), "opset 22 is newer than onnxruntime 1.19 runs"),
        (
            _model([helper.make_node("NoSuchOp", ["x"], ["y"])]),
            "ops onnxruntime 1.19 does not know: NoSuchOp (opset 17",
        ),
        (_model([helper.make_node("Gelu", ["x"], ["y"])], opset=17), "does not know: Gelu"),  # ONNX Gelu is opset 20
        (
            _model(
                [helper.make_node("FusedGelu", ["x"], ["y"], domain="com.microsoft")],
                extra_imports=[("com.microsoft", 1)],
            ),
            "FusedGelu (domain com.microsoft",
        ),
        (
            _model([helper.make_node("FusedMatMul", ["x", "x"], ["y"], domain="com.microsoft")]),
            "without an opset import",
        ),
    ],
)
def test_graphs_onnxruntime_refuses_get_one_line(model, fragment):
    with pytest.raises(RematError) as info:
        check_runtime_support(model, "m.onnx")
    message = str(info.value)
    assert fragment in message and "\n" not in message


def test_training_graphs_with_onnxruntime_ops_load(tmp_path):
    # The committed training graphs hold com.microsoft ops onnxruntime adds (FusedMatMul, ...).
    loaded = load_model(artifacts_dir("gpt"))
    assert any(n.domain == "com.microsoft" for n in loaded.model.graph.node)


def test_cli_names_the_unknown_op(cli, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_model([helper.make_node("NoSuchOp", ["x"], ["y"])]), str(path))
    assert_one_line_error(cli("scopes", path), "NoSuchOp", "does not know")


def test_op_table_matches_the_installed_onnxruntime():
    """Every op the table lists is one onnxruntime knows (probed through a session load), and an
    op it does not list at an opset is refused there: the table is onnxruntime's, not a guess."""
    from onnx_remat.runtime.op_table import Prober

    prober = Prober()
    for op, ranges in ort_ops.ONNX_DOMAIN_OPSETS.items():
        for lo, hi in ranges:
            assert prober.knows(op, "", lo) and prober.knows(op, "", hi), op
    assert not prober.knows("LayerNormalization", "", 6) or runtime_only("LayerNormalization", 6)
    for op in sorted(ort_ops.DOMAIN_OPS["com.microsoft"])[:40]:
        assert prober.knows(op, "com.microsoft", 17), op
    assert not prober.knows("NoSuchOp", "com.microsoft", 17)
    assert prober.ort.__version__ == ort_ops.ONNXRUNTIME_VERSION
