"""Which ops draw random numbers, and how a recompute reproduces them (Paddle's preserve_rng_state).

A recomputed random op must give exactly the values of the forward pass. onnx-remat never
re-runs a random generator: ops in :data:`RANDOM_OPS` keep their outputs stored, except a
training-mode ``Dropout`` with a mask output, whose output is *replayed* from the stored mask with
``com.microsoft::DropoutGrad(x, mask, ratio, training_mode)``. onnxruntime's CPU kernels compute
``Dropout`` as ``mask * x / (1 - ratio)`` and ``DropoutGrad`` as ``mask * dy / (1 - ratio)``: the
same expression, so the replay is bit-identical (tests/test_rewrite_runtime.py checks it). A
``Dropout`` in inference mode (``training_mode`` absent or a constant false) is a copy, cloned as
it is.
"""

from __future__ import annotations

import enum

import numpy as np
import onnx_graphsurgeon as gs

from onnx_remat.graph.conventions import RANDOM_OPS


class DropoutMode(enum.Enum):
    TRAIN = "train"  # draws a mask: replay from the stored mask
    EVAL = "eval"  # a copy: deterministic, clone as is
    UNKNOWN = "unknown"  # training_mode is computed at run time: keep stored


def dropout_mode(node: gs.Node) -> DropoutMode:
    """Whether a ``Dropout`` node is in training mode, judged from its constant inputs."""
    if len(node.inputs) < 3 or not node.inputs[2].name:
        return DropoutMode.EVAL
    mode = node.inputs[2]
    if not isinstance(mode, gs.Constant):
        return DropoutMode.UNKNOWN
    return DropoutMode.TRAIN if bool(np.asarray(mode.values).reshape(-1)[0]) else DropoutMode.EVAL


def is_random(node: gs.Node) -> bool:
    """True if re-running ``node`` would draw new random values."""
    if node.op == "Dropout" and not node.domain:
        return dropout_mode(node) is not DropoutMode.EVAL
    return node.op in RANDOM_OPS


def is_replayable(node: gs.Node) -> bool:
    """A training-mode ``Dropout`` whose mask output exists: its output can be replayed exactly."""
    return (
        node.op == "Dropout"
        and not node.domain
        and dropout_mode(node) is DropoutMode.TRAIN
        and len(node.outputs) > 1
        and bool(node.outputs[1].name)
    )


def replay_inputs(node: gs.Node, data: gs.Tensor) -> list[gs.Tensor]:
    """Inputs of the ``DropoutGrad`` that replays ``node`` on ``data`` (mask, ratio, mode as stored)."""
    extra = list(node.inputs[1:3])
    return [data, node.outputs[1], *extra]
