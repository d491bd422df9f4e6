"""Which ops draw random numbers, and how a recompute reproduces them (Paddle's preserve_rng_state).

A recomputed random op must give exactly the values of the forward pass. onnx-remat never
re-runs onnxruntime's global random generator: ops in :data:`RANDOM_OPS` keep their outputs
stored, except a training-mode ``Dropout`` with a mask output, which is reproduced in one of three
ways (``dropout=``, :data:`DROPOUT_MODES`):

``packed`` (default)
    replayed from its mask with ``com.microsoft::DropoutGrad(x, mask, ratio, training_mode)``;
    the mask is stored at one bit per element (:mod:`onnx_remat.remat.mask_packing`: packed in
    the forward pass right after the Dropout, unpacked when the segment is recomputed).
    onnxruntime's CPU kernels compute ``Dropout`` as ``mask * x / (1 - ratio)`` and
    ``DropoutGrad`` as ``mask * dy / (1 - ratio)``: the same expression, so the replay is
    bit-identical to the original graph (tests/remat/test_rewrite_runtime.py checks it).
``byte``
    the same replay from the mask stored as it is, one byte per element.
``seed``
    no mask stored: the forward Dropout gets a ``seed`` attribute, the recompute of its output is
    a second ``Dropout`` with the same seed, and its ``DropoutGrad(dy, mask)`` becomes
    ``Dropout(dy)`` with that seed (:func:`is_seedable_gradient`). With a ``seed`` onnxruntime
    gives each Dropout kernel a generator of its own (``RandomGenerator(seed)`` on CPU,
    ``PhiloxGenerator(seed)`` on CUDA, core/providers/{cpu,cuda}/nn/dropout*), and each draw
    advances it by one step (CPU: the seed of ``std::default_random_engine`` goes ``seed,
    seed + 1, ...``; CUDA: the Philox offset grows by an amount set by the element count and the
    device), so two kernels seeded alike and run once per training step draw the same masks,
    step after step (measured on CPU, tests/runtime/test_dropout_runtime.py; CUDA read from the
    source, not run). The random stream differs from the original graph's, which draws from
    onnxruntime's global generator: loss and gradients equal the original's only with the same
    seeds (``onnx-remat compare`` checks that).

A ``Dropout`` in inference mode (``training_mode`` absent or a constant false) is a copy, cloned
as it is.
"""

from __future__ import annotations

import enum

import numpy as np
import onnx_graphsurgeon as gs

from onnx_remat.graph.conventions import MS_DOMAIN, RANDOM_OPS

DROPOUT_MODES = ("packed", "seed", "byte")
DEFAULT_DROPOUT = "packed"

# std::default_random_engine (libstdc++'s minstd_rand0) keeps its seed modulo 2**31 - 1, and a
# seeded CPU kernel uses seed + k in step k: seeds of different Dropouts are spread over that range
# so that their streams do not meet (a stream of seed s reaches s + 1 after one step).
_SEED_RANGE = 2**31 - 1


def check_dropout_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`DROPOUT_MODES`, else a one-line RematError."""
    if mode not in DROPOUT_MODES:
        from onnx_remat.errors import RematError

        raise RematError(f"dropout must be one of {', '.join(DROPOUT_MODES)}, got {mode!r}")
    return mode


def dropout_seeds(names: list[str], base: int = 0) -> dict[str, int]:
    """A seed per Dropout (node names in forward order) for ``dropout="seed"``.

    Seeds are spread evenly over the CPU generator's range, so each Dropout's stream runs
    ``(2**31 - 1) // len(names)`` steps before it reaches the next one's first seed; ``base``
    shifts them all (another ``base``, other masks).
    """
    if not names:
        return {}
    stride = _SEED_RANGE // len(names)
    return {name: 1 + (base + k * stride) % (_SEED_RANGE - 1) for k, name in enumerate(names)}


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


def is_seedable_gradient(node: gs.Node, mask: gs.Tensor) -> bool:
    """A ``com.microsoft::DropoutGrad(dy, mask, ...)`` reading ``mask`` as its mask (input 1) only.

    With ``dropout="seed"`` such a node becomes ``Dropout(dy, ratio, training_mode)`` with the
    forward Dropout's seed: onnxruntime computes both as ``mask * x / (1 - ratio)`` (CPU:
    training_ops/cpu/nn/dropout_op.cc; CUDA: ``x * mask * (1 / (1 - ratio))`` in both kernels), so
    with the same mask the result is the same, and no mask is kept at all.
    """
    return (
        node.op == "DropoutGrad"
        and node.domain == MS_DOMAIN
        and len(node.inputs) >= 2
        and node.inputs[1] is mask
        and all(t is not mask for i, t in enumerate(node.inputs) if i != 1)
    )


def seed_of(node: gs.Node) -> int | None:
    """The ``seed`` attribute of a Dropout node, if it has one."""
    seed = node.attrs.get("seed")
    return None if seed is None else int(seed)
