"""Would onnxruntime's load accept this graph's data, types and shapes? Judged without a session.

onnxruntime 1.19 refuses a model at load, with graph optimizations off, when its types or shapes
do not hold together: a graph input retyped to a type its readers do not take (``INVALID_GRAPH
... Type Error``), an attribute that shape inference rejects (``[ShapeInferenceError]`` in a
``Gather`` whose axis is out of range), a shape tensor whose dims changed (``[ShapeInferenceError]``
in a ``Reshape``), an initializer whose bytes do not match its dims. Two checks find the same,
each linear in the model's size:

* :func:`check_initializer_data`: every initializer's stored data against its dims and element
  type (raw bytes, typed fields, the length an external-data entry declares); dims must be
  non-negative, the type defined;
* :func:`check_types_and_shapes`: ONNX's shape inference in strict mode with type checking and
  data propagation (the C++ inference onnxruntime runs at load), on the model's skeleton from
  :func:`onnx_remat.ortsim.registry.check_runtime_support` (no tensor data; onnxruntime's own
  default-domain ops moved to a domain inference skips, as onnxruntime infers those itself).

What only a session can tell (onnxruntime's own kernels' type rules) is left to the runtime layer.
Each failure is one line naming the tensor or node and the reason.
"""

from __future__ import annotations

import math
import os

import onnx

from onnx_remat.errors import RematError, one_line

# element type -> (typed field holding its values, values per element); None: raw bytes only
_TYPED_FIELD: dict[int, tuple[str, int]] = {
    onnx.TensorProto.FLOAT: ("float_data", 1),
    onnx.TensorProto.DOUBLE: ("double_data", 1),
    onnx.TensorProto.INT64: ("int64_data", 1),
    onnx.TensorProto.UINT64: ("uint64_data", 1),
    onnx.TensorProto.UINT32: ("uint64_data", 1),
    onnx.TensorProto.INT32: ("int32_data", 1),
    onnx.TensorProto.INT16: ("int32_data", 1),
    onnx.TensorProto.INT8: ("int32_data", 1),
    onnx.TensorProto.UINT16: ("int32_data", 1),
    onnx.TensorProto.UINT8: ("int32_data", 1),
    onnx.TensorProto.BOOL: ("int32_data", 1),
    onnx.TensorProto.FLOAT16: ("int32_data", 1),
    onnx.TensorProto.BFLOAT16: ("int32_data", 1),
    onnx.TensorProto.COMPLEX64: ("float_data", 2),
    onnx.TensorProto.COMPLEX128: ("double_data", 2),
    onnx.TensorProto.STRING: ("string_data", 1),
}
_SUB_BYTE = {
    getattr(onnx.TensorProto, name) for name in ("INT4", "UINT4", "FLOAT4E2M1") if hasattr(onnx.TensorProto, name)
}


def _itemsize(data_type: int) -> int | None:
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize
    except (KeyError, ValueError, TypeError):
        return None


def _external_length(tensor: onnx.TensorProto) -> int | None:
    for entry in tensor.external_data:
        if entry.key == "length":
            try:
                return int(entry.value)
            except ValueError:
                return None
    return None


def _initializer_problem(t: onnx.TensorProto) -> str | None:
    """Why onnxruntime would refuse initializer ``t``'s data, or None."""
    if t.data_type == onnx.TensorProto.UNDEFINED or t.data_type not in onnx.TensorProto.DataType.values():
        return f"element type {t.data_type} is not a tensor type"
    if any(d < 0 for d in t.dims):
        return f"dims {list(t.dims)} are negative"
    count = math.prod(t.dims)
    itemsize = _itemsize(t.data_type)
    if t.data_type in _SUB_BYTE:
        expected_bytes = (count + 1) // 2
    elif itemsize is not None and t.data_type != onnx.TensorProto.STRING:
        expected_bytes = count * itemsize
    else:
        expected_bytes = None
    if t.data_location == onnx.TensorProto.EXTERNAL:
        length = _external_length(t)
        if length is not None and expected_bytes is not None and length != expected_bytes:
            return f"dims {list(t.dims)} need {expected_bytes:,} bytes, its external data declares {length:,}"
        return None
    if t.HasField("raw_data"):
        if expected_bytes is not None and len(t.raw_data) != expected_bytes:
            return f"dims {list(t.dims)} need {expected_bytes:,} bytes of {_type_name(t)}, it holds {len(t.raw_data):,}"
        return None
    field, per = _TYPED_FIELD.get(t.data_type, (None, 1))
    if field is None:
        return None
    held = len(getattr(t, field))
    if held != count * per and not (held == 0 and count == 0):
        return f"dims {list(t.dims)} need {count * per:,} values of {_type_name(t)}, it holds {held:,}"
    return None


def _type_name(t: onnx.TensorProto) -> str:
    return onnx.TensorProto.DataType.Name(t.data_type).lower()


def check_initializer_data(model: onnx.ModelProto, where: str | os.PathLike = "model") -> None:
    """Raise a one-line :class:`RematError` naming the first initializer whose data does not match
    its dims and element type (also those of subgraphs and sparse initializers' values)."""
    stack = [model.graph]
    while stack:
        graph = stack.pop()
        tensors = [*graph.initializer, *(s.values for s in graph.sparse_initializer)]
        for t in tensors:
            problem = _initializer_problem(t)
            if problem is not None:
                raise RematError(f"{where}: initializer {t.name!r}: {problem}")
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    stack.append(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    stack.extend(attr.graphs)


class ShapeSuspicion(RematError):
    """Strict shape inference failed on a shape, not a type: onnxruntime refuses some such graphs at
    load (a Gather's axis past its rank) and loads others (a Reshape's shape given as an [n, 1]
    initializer), so only its own load can tell (:func:`onnx_remat.runtime.load_check.onnxruntime_load_error`)."""


# Messages of inference failures that are type errors: onnxruntime checks every node's input and
# output types against the op's type constraints at load, so these are always refused.
_TYPE_ERROR_MARKS = ("typestr", "type error", "typeinferenceerror", "unsupported type", "type mismatch")


# A declared tensor larger than this is a wrong dim, not a model: no accelerator or host onnxruntime
# trains on holds it. onnxruntime loads such a graph (a declared shape is not checked until a run
# feeds the input), but ONNX's data propagation materialises shape values of that size: a parameter
# input declared [10**12, 96, 4, 4] made it allocate terabytes (benchmarks/mutate.py, absurd-dim).
MAX_DECLARED_BYTES = 2**38


def check_declared_sizes(graph: onnx.GraphProto, where: str | os.PathLike = "model") -> None:
    """Raise a one-line :class:`RematError` naming the first graph input, output or value_info whose
    declared shape has a negative dim or holds more than :data:`MAX_DECLARED_BYTES`."""
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        tensor = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tensor.HasField("shape"):
            continue
        dims = [d.dim_value for d in tensor.shape.dim if d.HasField("dim_value")]
        shown = [d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in tensor.shape.dim]
        if any(d < 0 for d in dims):
            raise RematError(f"{where}: {vi.name!r} declares a negative dim: {shown}")
        size = math.prod(dims) * (_itemsize(tensor.elem_type) or 1)
        if size > MAX_DECLARED_BYTES:
            raise RematError(
                f"{where}: {vi.name!r} declares shape {shown}, {size / 2**40:,.0f} TiB or more: larger than "
                "any device holds (a wrong dim)"
            )


def check_types_and_shapes(
    skeleton: onnx.ModelProto, where: str | os.PathLike = "model", *, serialized: bytes | None = None
) -> onnx.ModelProto:
    """Strict ONNX shape inference with type checks on ``skeleton`` (a model without tensor data,
    see the module docstring), after :func:`check_declared_sizes`. A type error becomes a one-line
    :class:`RematError`; a shape error a :class:`ShapeSuspicion` (a RematError too), for the caller
    to confirm with onnxruntime. ``serialized``: the skeleton to infer on, in wire form, where
    ``skeleton`` holds only its graph's declarations (its nodes were never made Python messages).
    Returns the skeleton as inference typed it (inferred types in its ``value_info`` and outputs)."""
    check_declared_sizes(skeleton.graph, where)
    try:
        return onnx.shape_inference.infer_shapes(
            skeleton if serialized is None else serialized, check_type=True, strict_mode=True, data_prop=True
        )
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, ValueError, RuntimeError) as exc:
        # ValueError/RuntimeError: what ONNX's C++ raises past its own error types (seen by the mutation
        # fuzzer: "Invalid tensor data type 99." for a LayerNormalization stash_type out of range)
        message = _inference_message(exc)
        if any(mark in message.lower() for mark in _TYPE_ERROR_MARKS):
            raise RematError(f"{where}: onnxruntime would refuse it at load: {message}") from None
        raise ShapeSuspicion(f"{where}: onnxruntime refuses it at load: {message}") from None


def _inference_message(exc: BaseException) -> str:
    # "[ShapeInferenceError] (op_type:Gather, node name: /wte/Gather): indices typestr: ..." on one line
    return one_line(exc).replace("Inference error(s): ", "")
