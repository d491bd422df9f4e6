"""The naming conventions of training graphs, in one place.

onnxruntime-training's ``generate_artifacts`` (1.19) names what its gradient builder adds:

* gradient nodes ``<forward node>_Grad/<op>_<k>`` (marked with the doc string "Backward pass"),
  gradient sums ``AccumulateGrad_<tensor>_grad`` and accumulators ``GradientAccumulator<k>``
  (``InPlaceAccumulatorV2``);
* gradient tensors ``<tensor>_grad`` (and ``<tensor>_grad_<k>`` for the partial gradients of a
  tensor with several readers); the loss gradient seed is the initializer ``<loss>_grad``;
* per trainable parameter ``P`` the graph input ``P_grad.accumulation.buffer`` (written in place)
  and the output ``P_grad.accumulation.out``; the flag input ``lazy_reset_grad``.

Its fused and training ops live in the ``com.microsoft`` domain (:data:`MS_DOMAIN`).
"""

from __future__ import annotations

import re

import onnx

MS_DOMAIN = "com.microsoft"
DEFAULT_DOMAINS = ("", "ai.onnx")
# The attribute types that hold subgraphs (If, Loop, Scan bodies), whose nodes may read tensors of
# the graph around them by name, which a node's input list does not show.
SUBGRAPH_ATTRIBUTES = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)

GRADIENT_DOC = "Backward pass"
GRAD_SUFFIX = "_grad"
GRAD_NODE_INFIX = "_Grad/"
GRADIENT_SUM_PREFIX = "AccumulateGrad_"
ACCUMULATOR_PREFIX = "GradientAccumulator"
ACCUMULATOR_OPS = frozenset({"InPlaceAccumulatorV2", "InPlaceAccumulator", "ZeroGradient"})
BUFFER_SUFFIX = "_grad.accumulation.buffer"
RESET_FLAG = "lazy_reset_grad"

# Ops that draw random numbers: re-running one draws new values (remat/random_ops.py says how a
# recompute replays them; onnxruntime's CSE and constant folding never merge or fold them).
RANDOM_OPS = frozenset(
    {
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Bernoulli",
        "Multinomial",
        "Dropout",
        "BitmaskDropout",
        "BiasDropout",
        "BitmaskBiasDropout",
    }
)

_GRAD_TENSOR = re.compile(r"^(?P<base>.+)_grad(?:_\d+)?$")


def is_gradient_node_name(name: str) -> bool:
    """True for the node names onnxruntime's gradient builder gives."""
    return GRAD_NODE_INFIX in name or name.startswith((GRADIENT_SUM_PREFIX, ACCUMULATOR_PREFIX))


def forward_node_of_gradient(name: str) -> str | None:
    """``/blocks.0/MatMul`` for ``/blocks.0/MatMul_Grad/MatMul_1``; None for other names."""
    head, sep, _ = name.partition(GRAD_NODE_INFIX)
    return head if sep else None


def summed_tensor(name: str) -> str | None:
    """The tensor a gradient sum ``AccumulateGrad_<tensor>_grad`` is the gradient of, else None."""
    if not name.startswith(GRADIENT_SUM_PREFIX):
        return None
    grad = name[len(GRADIENT_SUM_PREFIX) :]
    return grad[: -len(GRAD_SUFFIX)] if grad.endswith(GRAD_SUFFIX) else grad


def base_of_gradient(name: str) -> str | None:
    """``x`` for ``x_grad`` or ``x_grad_3``; None for other names."""
    m = _GRAD_TENSOR.match(name)
    return m.group("base") if m else None


def buffer_of(parameter: str) -> str:
    """The accumulation-buffer input of trainable parameter ``parameter``."""
    return parameter + BUFFER_SUFFIX


def parameter_of_buffer(name: str) -> str | None:
    """The parameter whose accumulation buffer is ``name``, else None."""
    return name[: -len(BUFFER_SUFFIX)] if name.endswith(BUFFER_SUFFIX) else None
