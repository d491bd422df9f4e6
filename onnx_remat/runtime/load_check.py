"""onnxruntime's own verdict on loading a graph: what a static check cannot settle.

:func:`onnx_remat.ortsim.validity.check_types_and_shapes` flags a shape that strict ONNX inference
rejects (:class:`~onnx_remat.ortsim.validity.ShapeSuspicion`); onnxruntime refuses some such
graphs at load and runs others; and onnxruntime's own ops (``com.microsoft`` gradients,
``InPlaceAccumulatorV2``, ...) are typed and attribute-checked by nothing but its load.
:func:`onnxruntime_load_error` asks onnxruntime, with graph optimizations off, as the model's
reader would meet it: once per command, when a model is read
(:func:`onnx_remat.model_io.check_loadable`).
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx

from onnx_remat.interrupts import critical


def onnxruntime_load_error(model: str | os.PathLike | onnx.ModelProto) -> str | None:
    """The first line of onnxruntime's error when it refuses to load ``model`` (a file, or a model
    in memory), else None."""
    # Imported here, not at the top (commands that never read a model skip it), and with signals
    # held: a Ctrl-C or SIGTERM inside the extension's initialisation would surface as an
    # ImportError ("initialization failed") instead of the command's clean interrupted exit.
    with critical():
        import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(Path(model))
    try:
        ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types (Fail, InvalidGraph, ...)
        text = " ".join(str(exc).split())
        return text[:400] or type(exc).__name__
    return None
