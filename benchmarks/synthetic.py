"""Synthetic training graphs of any size, for scale benchmarks and tests (no PyTorch needed).

``forward_model(blocks)`` builds a forward ONNX graph of ``blocks`` residual blocks named the way
the TorchScript exporter names nodes (``/blocks.<i>/MatMul``), each
``x + MatMul(Dropout(Softmax(Relu(MatMul(x, W1) + b1))), W2)``; ``training_artifacts(blocks, dir)``
turns it into onnxruntime-training artifacts with ``generate_artifacts`` (MSE loss, AdamW). A block
is about 30 nodes of training graph: 700 blocks make a graph of ~21,000 nodes.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 8
OPSET = 17


def forward_model(
    blocks: int, *, batch: int = 2, seq: int = 8, width: int = 16, dropout: float = 0.1
) -> onnx.ModelProto:
    """A forward graph of ``blocks`` residual blocks with dropout (seeded weights)."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    inits += [
        numpy_helper.from_array(np.array(dropout, np.float32), "dropout_ratio"),
        numpy_helper.from_array(np.array(True), "training_mode"),
    ]
    x = "x"
    for i in range(blocks):
        p = f"/blocks.{i}"
        w1, b1, w2 = f"blocks.{i}.fc1.weight", f"blocks.{i}.fc1.bias", f"blocks.{i}.fc2.weight"
        inits += [
            numpy_helper.from_array((rng.standard_normal((width, width)) * 0.1).astype(np.float32), w1),
            numpy_helper.from_array(np.zeros(width, np.float32), b1),
            numpy_helper.from_array((rng.standard_normal((width, width)) * 0.1).astype(np.float32), w2),
        ]

        def node(op, inputs, outputs, name, p=p, **attrs):
            nodes.append(helper.make_node(op, inputs, outputs, name=f"{p}/{name}", **attrs))

        node("MatMul", [x, w1], [f"{p}/fc1/MatMul_output_0"], "fc1/MatMul")
        node("Add", [f"{p}/fc1/MatMul_output_0", b1], [f"{p}/fc1/Add_output_0"], "fc1/Add")
        node("Relu", [f"{p}/fc1/Add_output_0"], [f"{p}/Relu_output_0"], "Relu")
        node("Softmax", [f"{p}/Relu_output_0"], [f"{p}/Softmax_output_0"], "Softmax", axis=-1)
        node(
            "Dropout",
            [f"{p}/Softmax_output_0", "dropout_ratio", "training_mode"],
            [f"{p}/drop/Dropout_output_0", f"{p}/drop/Dropout_output_1"],
            "drop/Dropout",
        )
        node("MatMul", [f"{p}/drop/Dropout_output_0", w2], [f"{p}/fc2/MatMul_output_0"], "fc2/MatMul")
        node("Add", [f"{p}/fc2/MatMul_output_0", x], [f"{p}/Add_output_0"], "Add")
        x = f"{p}/Add_output_0"
    nodes.append(helper.make_node("Identity", [x], ["y"], name="/Identity"))
    graph = helper.make_graph(
        nodes,
        "synthetic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, width])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def training_artifacts(blocks: int, out_dir: str | os.PathLike, **kwargs) -> Path:
    """Write onnxruntime-training artifacts of a ``blocks``-block synthetic model into ``out_dir``."""
    from onnxruntime.training import artifacts  # imported late: it imports torch when present

    model = forward_model(blocks, **kwargs)
    params = [i.name for i in model.graph.initializer if i.name.startswith("blocks.")]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    saved = os.dup(2)  # the gradient builder logs at INFO level on fd 2 whatever the severity
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            artifacts.generate_artifacts(
                model,
                requires_grad=params,
                loss=artifacts.LossType.MSELoss,
                optimizer=artifacts.OptimType.AdamW,
                artifact_directory=str(out),
            )
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    return out
