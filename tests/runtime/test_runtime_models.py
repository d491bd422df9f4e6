"""Small training graphs for the runtime tests, built with onnx.helper + generate_artifacts.

Other runtime test modules import this file by path (so it works whether or not tests/ is a
package) and call
:func:`tiny_artifacts`, which builds each variant once per pytest run under pytest's base temp
directory. The tests here only check the builders themselves.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
BLOCKS10 = ROOT / "models" / "artifacts" / "blocks10"
PARAMS = ["emb.weight", "fc1.weight", "fc1.bias", "fc2.weight"]


def tiny_forward(
    batch: int | str = 8192, vocab: int = 100, hidden: int = 256, classes: int = 10, extra_param: bool = False
) -> onnx.ModelProto:
    """Embedding (Gather) -> Linear -> Relu -> Dropout(0.1, training) -> Linear -> logits.

    ``input_ids`` is int64 ``[batch]`` (a string batch makes it symbolic); activations are
    ``batch x hidden`` float32 (8 MiB at the default size).
    """
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((rng.standard_normal((vocab, hidden)) * 0.1).astype(np.float32), "emb.weight"),
        numpy_helper.from_array((rng.standard_normal((hidden, hidden)) / 16).astype(np.float32), "fc1.weight"),
        numpy_helper.from_array(np.zeros(hidden, np.float32), "fc1.bias"),
        numpy_helper.from_array((rng.standard_normal((hidden, classes)) / 16).astype(np.float32), "fc2.weight"),
        numpy_helper.from_array(np.array(0.1, np.float32), "ratio"),
        numpy_helper.from_array(np.array(True), "training"),
    ]
    nodes = [
        helper.make_node("Gather", ["emb.weight", "input_ids"], ["h0"], name="/emb/Gather"),
        helper.make_node("MatMul", ["h0", "fc1.weight"], ["h1"], name="/block/fc1/MatMul"),
        helper.make_node("Add", ["h1", "fc1.bias"], ["h2"], name="/block/fc1/Add"),
        helper.make_node("Relu", ["h2"], ["h3"], name="/block/act/Relu"),
        helper.make_node("Dropout", ["h3", "ratio", "training"], ["h4", "mask"], name="/block/drop/Dropout"),
        helper.make_node("MatMul", ["h4", "fc2.weight"], ["logits"], name="/head/MatMul"),
    ]
    if extra_param:
        inits.append(numpy_helper.from_array(np.ones(classes, np.float32), "head.scale"))
        nodes[-1].output[0] = "logits0"
        nodes.append(helper.make_node("Mul", ["logits0", "head.scale"], ["logits"], name="/head/Mul"))
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [batch])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, classes])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@contextlib.contextmanager
def _quiet_fd2():
    """generate_artifacts logs every graph transformer from C++ on fd 2."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def build_artifacts(out: Path, **kw) -> Path:
    """Training artifacts (cross-entropy loss, AdamW) of :func:`tiny_forward` in ``out``."""
    from onnxruntime.training import artifacts
    from onnxruntime.training.onnxblock import _graph_utils

    _graph_utils._GRAPH_TOKEN = 0  # onnxblock names nodes with a process-wide counter
    extra = kw.get("extra_param", False)
    model = tiny_forward(**kw)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    with _quiet_fd2():
        artifacts.generate_artifacts(
            model,
            requires_grad=PARAMS + (["head.scale"] if extra else []),
            loss=artifacts.LossType.CrossEntropyLoss,
            optimizer=artifacts.OptimType.AdamW,
            artifact_directory=str(tmp),
        )
    os.replace(tmp, out)
    return out


def tiny_artifacts(base: Path, name: str = "tiny", **kw) -> Path:
    """The artifacts of variant ``name`` under ``base``, built on first use (once per pytest run)."""
    out = base / f"runtime-{name}"
    if not (out / "training_model.onnx").exists():
        build_artifacts(out, **kw)
    return out


def nan_loss_model(path: Path) -> Path:
    """A plain graph whose first output (the "loss") is NaN: mean(log(x - 100)) for normal x."""
    nodes = [
        helper.make_node("Sub", ["x", "c"], ["d"]),
        helper.make_node("Log", ["d"], ["l"]),
        helper.make_node("ReduceMean", ["l"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "nan",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(np.array(100.0, np.float32), "c")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def checkpoint_lacking(base: Path) -> Path:
    """An artifacts dir whose checkpoint lacks the graph's parameter ``head.scale``."""
    with_extra = tiny_artifacts(base, "extra", batch=64, extra_param=True)
    plain = tiny_artifacts(base, "small", batch=64)
    out = base / "runtime-lacking"
    if not out.exists():
        shutil.copytree(with_extra, out)
        shutil.copy2(plain / "checkpoint", out / "checkpoint")
    return out


# -- tests of the builders ----------------------------------------------------------------------


def test_tiny_forward_is_valid():
    onnx.checker.check_model(tiny_forward(batch=16))
    onnx.checker.check_model(tiny_forward(batch="batch", extra_param=True))


def test_nan_loss_model_is_valid(tmp_path):
    onnx.checker.check_model(onnx.load(str(nan_loss_model(tmp_path / "nan.onnx"))))
