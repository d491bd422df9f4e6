"""Which onnxruntime CPU kernels share memory between an input and an output.

onnxruntime's allocation planner (``core/framework/allocation_planner.cc``, ``FindReusableInput``)
gives an output the buffer of one of its node's inputs in three cases, declared by the kernel:

* ``Alias(i, o)``: output ``o`` *is* input ``i`` (Reshape, Squeeze, Unsqueeze, Flatten, Identity,
  ``InPlaceAccumulatorV2``'s second output, ``BatchNormInternal``'s running statistics). Always,
  even when the input lives on.
* ``VariadicAlias(i0, o0)``: output ``o0 + k`` is input ``i0 + k`` for every ``k``
  (``com.microsoft::PassThrough``, ``YieldOp``).
* ``MayInplace(i, o)``: output ``o`` may overwrite input ``i`` when this node is the input's last
  reader and both have the same static shape and element size (the element-wise activations,
  Softmax / LogSoftmax, Clip, Cast).

The table below is read off the kernel registrations of onnxruntime 1.19 (CPU execution
provider and the training kernels) for the ops training graphs use, and checked by measurement
(:data:`MAY_INPLACE`); an op not listed shares nothing. Binary element-wise ops (Add, Mul, ...)
and the gradient kernels (ReluGrad, SoftmaxGrad, DropoutGrad, ...) do not declare in-place reuse
on CPU.
"""

from __future__ import annotations

import functools

from onnx_remat.graph.conventions import MS_DOMAIN as MS

# (domain, op) -> [(input index, output index)]
ALIAS: dict[tuple[str, str], tuple[tuple[int, int], ...]] = {
    ("", "Reshape"): ((0, 0),),
    ("", "Squeeze"): ((0, 0),),
    ("", "Unsqueeze"): ((0, 0),),
    ("", "Flatten"): ((0, 0),),
    ("", "Identity"): ((0, 0),),
    (MS, "ExpandDims"): ((0, 0),),
    (MS, "BatchNormInternal"): ((3, 1), (4, 2)),  # running mean / var updated in place
    (MS, "InPlaceAccumulator"): ((0, 0),),
    (MS, "InPlaceAccumulatorV2"): ((0, 1),),
    (MS, "ZeroGradient"): ((0, 0),),
}

# (domain, op) -> inputs the kernel *writes* (an Alias whose output is a new value, not a view):
# running statistics updated in place, gradient buffers accumulated into or zeroed.
WRITES_INPUTS: dict[tuple[str, str], tuple[int, ...]] = {
    (MS, "BatchNormInternal"): (3, 4),
    (MS, "InPlaceAccumulator"): (0,),
    (MS, "InPlaceAccumulatorV2"): (0,),
    (MS, "ZeroGradient"): (0,),
}

# (domain, op) -> (first input, first output)
VARIADIC_ALIAS: dict[tuple[str, str], tuple[int, int]] = {
    (MS, "PassThrough"): (0, 0),
    (MS, "YieldOp"): (0, 0),
}

# Measured on onnxruntime-training-cpu 1.19.2 (tests/test_estimate_rules.py): a one-input graph
# x -> Neg -> a -> Op -> b is planned at one buffer for these ops, two for every other op probed
# (the binary element-wise ops, Where, Pow, Sum, Erf, Exp, Sqrt, Log, Reciprocal, Neg, Abs,
# Dropout, Gelu / FastGelu / QuickGelu / BiasGelu and every *Grad kernel). Cast works in place
# when the element sizes match (float <-> int32, ...): the same-shape-and-size test covers it.
MAY_INPLACE: dict[tuple[str, str], tuple[tuple[int, int], ...]] = {
    ("", op): ((0, 0),)
    for op in (
        "Cast",
        "Celu",
        "Clip",
        "Elu",
        "HardSigmoid",
        "LeakyRelu",
        "LogSoftmax",
        "Relu",
        "Selu",
        "Shrink",
        "Sigmoid",
        "Softmax",
        "Softplus",
        "Softsign",
        "Tanh",
        "ThresholdedRelu",
    )
}


def op_key(domain: str, op: str) -> tuple[str, str]:
    """Normalize ``ai.onnx`` to the empty default domain."""
    return ("" if domain in ("", "ai.onnx") else domain, op)


@functools.cache
def alias_input(domain: str, op: str, output_index: int, n_inputs: int) -> int | None:
    """The input whose buffer output ``output_index`` must share (Alias / VariadicAlias), or None."""
    key = op_key(domain, op)
    for i, o in ALIAS.get(key, ()):
        if o == output_index and i < n_inputs:
            return i
    variadic = VARIADIC_ALIAS.get(key)
    if variadic is not None:
        i = output_index - variadic[1] + variadic[0]
        if 0 <= i < n_inputs:
            return i
    return None


@functools.cache
def inplace_inputs(domain: str, op: str, output_index: int, n_inputs: int) -> tuple[int, ...]:
    """Inputs whose buffer output ``output_index`` may take over (MayInplace), in declaration order."""
    return tuple(i for i, o in MAY_INPLACE.get(op_key(domain, op), ()) if o == output_index and i < n_inputs)


def written_inputs(domain: str, op: str) -> tuple[int, ...]:
    """Inputs a node of this op overwrites in place (:data:`WRITES_INPUTS`)."""
    return WRITES_INPUTS.get(op_key(domain, op), ())
