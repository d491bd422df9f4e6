"""Dropout masks at one bit per element: the nodes that pack a bool mask into bytes and unpack it.

A recomputed ``Dropout`` is replayed from its mask (:mod:`onnx_remat.remat.random_ops`). The
mask is a bool tensor, one byte per element; :func:`pack` stores it as ``uint8`` with eight
elements per byte (element ``8*i + j`` is bit ``j`` of byte ``i``, the last byte padded with
zeros) and :func:`unpack` turns such bytes back into the bool mask, bit for bit.

Only ops that onnxruntime 1.19 has CPU *and* CUDA kernels for are used, at the graph's own
opset (10 and up; a size known only at run time needs 13 for ``Pad`` of bool). Checked on CPU by
running them (tests/remat/test_dropout.py); the CUDA kernels from onnxruntime's registrations
(not run: no GPU here):

pack (in the forward pass, right after the Dropout)
    ``Reshape(mask, [1, -1, 8])`` (a view) -> ``Cast(to=INT8)`` -> ``MatMulInteger(bits, W)``
    with ``W = [1, 2, 4, ..., 64, -128]`` (int8, shape [8, 1]), whose int32 result is the byte's
    value as a signed int8 -> ``Cast(to=UINT8)`` (modulo 256: the byte) -> ``Reshape`` to [m].
    Summing eight weighted bits needs integer arithmetic, and 8-bit arithmetic is scarce: on
    CPU onnxruntime 1.19 has no ``Add``, ``Mul``, ``Sum`` or ``ReduceSum`` kernel for uint8 (it
    says NOT_IMPLEMENTED), ``BitwiseOr`` needs opset 18 and CUDA has neither ``BitShift`` nor
    ``BitwiseOr``/``BitwiseAnd``; ``MatMulInteger`` runs on both (CUDA: int8 x int8 only, hence
    the signed weights). A float ``MatMul`` would work too, at four bytes of scratch per element
    instead of one.
    A size that is not a multiple of 8 is padded first (``Concat`` with a constant tail of
    ``False``; for a size known only at run time ``Pad``).
unpack (in the backward pass, behind the segment's barrier)
    ``Cast(packed, to=INT32)`` -> ``Gather(TABLE, ·)`` where ``TABLE[v]`` are the 8 bits of ``v``
    (a 256 x 8 bool constant, 2 KiB) -> ``Reshape`` to the mask's shape (after a ``Slice`` that
    drops the padding). One lookup per byte and no bit arithmetic, which CUDA lacks for uint8
    (``BitShift``, ``BitwiseAnd``, ``Mod`` of uint8).

Bytes: the packed mask is ``ceil(n / 8)`` bytes for ``n`` elements (:func:`packed_nbytes`); the
scratch of packing is one int8 copy of the mask plus ``n / 2`` bytes of int32 sums; unpacking
allocates ``n / 2`` bytes of int32 indices and the bool mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from onnx_remat.graph.bridge import new_node, new_variable

BITS = 8
MIN_OPSET = 10  # MatMulInteger
PAD_OPSET = 13  # Pad of bool (sizes known only at run time)

# Bit j of a byte has weight 2**j; bit 7 is -128 in int8, so the int32 sum is the byte as int8.
_WEIGHTS = np.array([[1], [2], [4], [8], [16], [32], [64], [-128]], dtype=np.int8)
# _TABLE[v, j] is bit j of v.
_TABLE = ((np.arange(256, dtype=np.int64)[:, None] >> np.arange(BITS)) & 1).astype(bool)

WEIGHTS_NAME = "remat_pack/bit_weights"
TABLE_NAME = "remat_unpack/bit_table"


def packed_nbytes(elements: int) -> int:
    """Bytes of a packed mask of ``elements`` elements: one bit each, the last byte padded."""
    return -(-elements // BITS)


def static_shape(shape: Sequence | None) -> tuple[int, ...] | None:
    """``shape`` as a tuple of ints when every dimension is a known integer, else None."""
    if shape is None:
        return None
    dims = tuple(shape)
    if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in dims):
        return None
    return tuple(int(d) for d in dims)


def can_pack(shape: Sequence | None, opset: int) -> bool:
    """Whether a mask of this shape can be packed in a graph of this default-domain opset."""
    if opset < MIN_OPSET:
        return False
    return static_shape(shape) is not None or opset >= PAD_OPSET


@dataclass
class Packed:
    """The forward-pass nodes that pack one mask, and the tensors a recompute reads back."""

    nodes: list[gs.Node]
    packed: gs.Variable  # uint8 [ceil(n / 8)]
    elements: int | None  # n when known statically
    # When the shape is known only at run time: the mask's shape and its size as [n] (int64), read
    # back by unpack with the packed bytes.
    extra: list[gs.Variable] = field(default_factory=list)


def _constant(name: str, values, cache: dict[str, gs.Constant]) -> gs.Constant:
    const = cache.get(name)
    if const is None:
        const = cache[name] = gs.Constant(name, np.asarray(values))
    return const


def pack(
    mask: gs.Tensor,
    shape: Sequence | None,
    prefix: str,
    constants: dict[str, gs.Constant],
) -> Packed:
    """Nodes packing the bool tensor ``mask`` (``shape``: its dims, ints or symbols) into bytes.

    Node names start with ``prefix``; the tensors with ``<mask>/remat_pack/``. ``constants``
    shares the weights and the shape constants between masks (pass the same dict every time).
    """
    static = static_shape(shape)
    base = f"{mask.name}/remat_pack"
    nodes: list[gs.Node] = []

    def add(op: str, suffix: str, inputs: list[gs.Tensor], dtype, out_shape=None, **attrs) -> gs.Variable:
        out = new_variable(f"{base}/{suffix}", dtype=dtype, shape=out_shape)
        nodes.append(new_node(op=op, name=f"{prefix}/{suffix}", inputs=inputs, outputs=[out], attrs=attrs))
        return out

    extra: list[gs.Variable] = []
    if static is not None:
        n = int(np.prod(static, dtype=np.int64))
        m = packed_nbytes(n)
        pad = m * BITS - n
        flat: gs.Tensor = mask
        if pad:
            flat = add(
                "Reshape",
                "flat",
                [mask, _constant("remat_pack/shape_flat", np.array([-1], np.int64), constants)],
                np.bool_,
                [n],
            )
            tail = _constant(f"remat_pack/false_{pad}", np.zeros(pad, dtype=bool), constants)
            flat = add("Concat", "padded", [flat, tail], np.bool_, [m * BITS], axis=0)
    else:
        n = None
        m = None
        one = _constant("remat_pack/shape_one", np.array([1], np.int64), constants)
        extra.append(add("Shape", "shape", [mask], np.int64, None))
        flat = add(
            "Reshape",
            "flat",
            [mask, _constant("remat_pack/shape_flat", np.array([-1], np.int64), constants)],
            np.bool_,
            None,
        )
        size = add("Size", "size", [mask], np.int64, None)
        extra.append(add("Reshape", "size_1", [size, one], np.int64, [1]))
        eight = _constant("remat_pack/eight", np.array(BITS, np.int64), constants)
        rem = add("Mod", "rem", [size, eight], np.int64, None)
        short = add("Sub", "short", [eight, rem], np.int64, None)
        pad_t = add("Mod", "pad", [short, eight], np.int64, None)
        pad_1 = add("Reshape", "pad_1", [pad_t, one], np.int64, [1])
        pads = add(
            "Concat",
            "pads",
            [_constant("remat_pack/zero_1", np.array([0], np.int64), constants), pad_1],
            np.int64,
            [2],
            axis=0,
        )
        flat = add("Pad", "padded", [flat, pads], np.bool_, None)
    # The scratch shapes ([1, m, 8], [1, m, 1]) differ from the unpacking's ([m], [m, 8]) on purpose:
    # onnxruntime's planner gives a new tensor the freed buffer of a tensor with the same shape and
    # element size and then keeps that buffer allocated from the first tensor to the last, so
    # shared shapes would keep the forward pass's packing scratch allocated through the backward.
    rows = add(
        "Reshape",
        "rows",
        [flat, _constant("remat_pack/shape_rows", np.array([1, -1, BITS], np.int64), constants)],
        np.bool_,
        [1, m, BITS] if m is not None else None,
    )
    bits = add("Cast", "bits", [rows], np.int8, [1, m, BITS] if m is not None else None, to=int(_onnx_type(np.int8)))
    weights = _constant(WEIGHTS_NAME, _WEIGHTS, constants)
    sums = add("MatMulInteger", "sums", [bits, weights], np.int32, [1, m, 1] if m is not None else None)
    as_bytes = add(
        "Cast", "bytes", [sums], np.uint8, [1, m, 1] if m is not None else None, to=int(_onnx_type(np.uint8))
    )
    flat_shape = _constant("remat_pack/shape_flat", np.array([-1], np.int64), constants)
    packed = add("Reshape", "packed", [as_bytes, flat_shape], np.uint8, [m] if m is not None else None)
    packed.name = f"{mask.name}/remat_packed"
    return Packed(nodes=nodes, packed=packed, elements=n, extra=extra)


def unpack(
    packed: gs.Tensor,
    extra: Sequence[gs.Tensor],
    static: Sequence[int] | None,
    out: gs.Variable,
    prefix: str,
    constants: dict[str, gs.Constant],
) -> list[gs.Node]:
    """Nodes turning ``packed`` (bytes from :func:`pack`) into the bool mask ``out``.

    ``static``: the mask's shape when known, else ``extra`` are :attr:`Packed.extra` read back
    (its shape and size). Node names start with ``prefix``, tensors with ``<out>/unpack/``.
    """
    base = f"{out.name}/unpack"
    nodes: list[gs.Node] = []

    def add(op: str, suffix: str, inputs: list[gs.Tensor], dtype, out_shape=None, result=None, **attrs):
        t = result if result is not None else new_variable(f"{base}/{suffix}", dtype=dtype, shape=out_shape)
        nodes.append(new_node(op=op, name=f"{prefix}/{suffix}", inputs=inputs, outputs=[t], attrs=attrs))
        return t

    index = add("Cast", "index", [packed], np.int32, None, to=int(_onnx_type(np.int32)))
    table = _constant(TABLE_NAME, _TABLE, constants)
    bits = add("Gather", "bits", [table, index], np.bool_, None, axis=0)
    if static is not None:
        n = int(np.prod(static, dtype=np.int64))
        if packed_nbytes(n) * BITS == n:
            target = _constant(
                f"remat_unpack/shape_{'x'.join(map(str, static))}", np.array(static, np.int64), constants
            )
            add("Reshape", "mask", [bits, target], np.bool_, result=out)
            return nodes
        flat = add(
            "Reshape",
            "flat",
            [bits, _constant("remat_pack/shape_flat", np.array([-1], np.int64), constants)],
            np.bool_,
            None,
        )
        zero = _constant("remat_pack/zero_1", np.array([0], np.int64), constants)
        end = _constant(f"remat_unpack/end_{n}", np.array([n], np.int64), constants)
        cut = add("Slice", "cut", [flat, zero, end], np.bool_, [n])
        target = _constant(f"remat_unpack/shape_{'x'.join(map(str, static))}", np.array(static, np.int64), constants)
        add("Reshape", "mask", [cut, target], np.bool_, result=out)
        return nodes
    if len(extra) != 2:
        raise ValueError("unpack needs the mask's shape: static dims or the shape and size that pack stored")
    shape, size = extra
    flat = add(
        "Reshape",
        "flat",
        [bits, _constant("remat_pack/shape_flat", np.array([-1], np.int64), constants)],
        np.bool_,
        None,
    )
    zero = _constant("remat_pack/zero_1", np.array([0], np.int64), constants)
    cut = add("Slice", "cut", [flat, zero, size], np.bool_, None)
    add("Reshape", "mask", [cut, shape], np.bool_, result=out)
    return nodes


def _onnx_type(dtype) -> int:
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def default_opset(model) -> int:
    """The default-domain opset a model imports (``ai.onnx`` or the empty domain; 1 if none)."""
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 1
