"""Tensor shapes and byte sizes of a model, from what it declares and what inference finds.

Sources, in order: the model's graph inputs, outputs, initializers and ``value_info``; onnx's
shape inference with data propagation (standard ops); onnxruntime's symbolic shape inference
when asked (contrib and gradient ops: :meth:`TensorSizes.add_ort_inference`); and the gradient
naming convention ``<tensor>_grad`` / ``<tensor>_grad_<k>``, whose shape is ``<tensor>``'s.

Symbolic dimensions (``dim_param``) are bound with ``dims`` (``{"batch": 8}``); a size that still
depends on an unbound symbol, or on nothing known, is ``None``, never a silent zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import cast

import numpy as np
import onnx

from onnx_remat.graph.conventions import base_of_gradient
from onnx_remat.graph.skeleton import INFERENCE_DATA_BYTES, skeleton_bytes, skeleton_header

Dim = int | str | None


def dtype_size(elem_type: int) -> int | None:
    """Bytes per element of an ONNX tensor element type (None for strings and unknown types)."""
    if elem_type in (onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING):
        return None
    try:
        return int(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).itemsize)
    except (KeyError, TypeError, ValueError):
        return None


_ITEMSIZE: dict[int, int | None] = {}  # element type -> bytes (dtype_size, memoized: asked per tensor)


def _dims_of(type_proto: onnx.TypeProto) -> tuple[int, tuple[Dim, ...] | None] | None:
    """``(element type, dims)`` of a tensor type (dims None where the rank is unknown), or None
    for a type that is not a tensor. Memoized on the type's bytes: a graph has tens of thousands
    of value infos but a few dozen distinct types, and reading a type field by field costs about
    five times serializing it."""
    key = type_proto.SerializeToString()
    if key in _DIMS_BY_TYPE:
        return _DIMS_BY_TYPE[key]
    if len(_DIMS_BY_TYPE) >= _DIMS_BY_TYPE_LIMIT:  # bounded: the memo outlives the model
        _DIMS_BY_TYPE.clear()
    found = _DIMS_BY_TYPE[key] = _read_dims(type_proto)
    return found


_DIMS_BY_TYPE: dict[bytes, tuple[int, tuple[Dim, ...] | None] | None] = {}
_DIMS_BY_TYPE_LIMIT = 1 << 16
_UNSEEN = object()


def _read_dims(type_proto: onnx.TypeProto) -> tuple[int, tuple[Dim, ...] | None] | None:
    if not type_proto.HasField("tensor_type"):
        return None
    tt = type_proto.tensor_type
    if not tt.HasField("shape"):
        return tt.elem_type, None
    dims: list[Dim] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return tt.elem_type, tuple(dims)


class TensorSizes:
    """Shapes and byte sizes of a model's tensors.

    >>> sizes = TensorSizes(model, dims={"batch": 8})
    >>> sizes.nbytes("/blocks.0/Softmax_output_0")
    8388608
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        dims: Mapping[str, int] | None = None,
        *,
        infer: bool = True,
        inferred: onnx.ModelProto | None = None,
    ):
        """``inferred``: ``model``'s skeleton as onnx's inference typed it already (strict or not: where
        it finished, the types are the same), from
        :func:`~onnx_remat.ortsim.registry.check_runtime_support` with ``shapes`` where the model
        was read: its types are taken rather than inferred again."""
        self.dims: dict[str, int] = dict(dims or {})
        self._info: dict[str, tuple[int, tuple[Dim, ...] | None]] = {}
        # nbytes per name, asked for every tensor of every plan the emulation makes; emptied when a
        # shape is added (the dims are bound at construction and not changed afterwards)
        self._nbytes: dict[str, int | None] = {}
        # (element type, declared dims) per name, for the planner's reuse keys; emptied with _nbytes
        self._declared_keys: dict[str, tuple[int, tuple[Dim, ...]] | None] = {}
        self.inference_error: str | None = None
        self._add_graph(model.graph)
        if inferred is not None:
            self._add_inferred(inferred)
        elif infer:
            self._infer(model)

    def _add_value_infos(self, value_infos: Iterable[onnx.ValueInfoProto], overwrite: bool = False) -> None:
        for vi in value_infos:
            info = _dims_of(vi.type)
            if info is not None:
                self._merge(vi.name, info, overwrite)

    def _merge(self, name: str, info: tuple[int, tuple[Dim, ...] | None], overwrite: bool = False) -> None:
        """Take ``info`` for ``name`` where nothing is known of it, or only its type, or ``overwrite``."""
        old = self._info.get(name)
        if overwrite or old is None or (old[1] is None and info[1] is not None):
            self._info[name] = info
            self._nbytes.clear()
            self._declared_keys.clear()

    def _add_graph(self, graph: onnx.GraphProto) -> None:
        for init in graph.initializer:
            self._info[init.name] = (init.data_type, tuple(int(d) for d in init.dims))
        self._add_value_infos(graph.input)
        self._add_value_infos(graph.output)
        self._add_value_infos(graph.value_info)

    def _infer(self, model: onnx.ModelProto) -> None:
        # On the model's skeleton: its weights' data would be serialized and parsed back for
        # nothing (inference reads only small integer tensors' values, a Reshape's shape).
        skeleton = skeleton_bytes(skeleton_header(model, keep_data_upto=INFERENCE_DATA_BYTES), model.graph)
        try:
            inferred = onnx.shape_inference.infer_shapes(skeleton, strict_mode=False, data_prop=True)
        except Exception as exc:  # inference failing is a lack of information, not an error
            self.inference_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return
        self._add_inferred(inferred)

    def _add_inferred(self, inferred: onnx.ModelProto) -> None:
        self._add_value_infos(inferred.graph.value_info)
        self._add_value_infos(inferred.graph.output)

    def extended_to(self, graph: onnx.GraphProto, copies: Mapping[str, str]) -> TensorSizes:
        """A copy of these sizes for ``graph``, which holds every tensor these sizes were made for
        and new ones (a rewrite of their graph): ``graph``'s initializers and declarations of
        tensors these sizes do not know are added, as the constructor would merge them; then each
        tensor of ``copies`` still unknown (new name -> the tensor it is a copy of: made by the same
        op with the same attributes from inputs of the same shapes) takes that tensor's shape.
        Nothing is inferred: :func:`onnx_remat.ortsim.shapes.rewrite_sizes` infers the rest."""
        new = self.copy(memos=False)
        info = new._info
        for init in graph.initializer:
            if init.name not in info:
                info[init.name] = (init.data_type, tuple(int(d) for d in init.dims))
        for declared in (graph.input, graph.output, graph.value_info):
            # the names are read first: most are known with a shape, and reading a type costs more
            unknown = [vi for vi in declared if (old := info.get(vi.name)) is None or old[1] is None]
            new._add_value_infos(unknown)
        for name, source in copies.items():
            if name not in info and source in info:
                info[name] = info[source]
        return new

    def add_value_infos(self, value_infos: Iterable[onnx.ValueInfoProto]) -> None:
        """Add shapes found elsewhere (e.g. by onnxruntime's symbolic shape inference)."""
        self._add_value_infos(value_infos)

    def declare(self, name: str, elem_type: int, dims: Sequence[Dim | None]) -> None:
        """:meth:`add_value_infos` of one tensor of known element type and rank, without the
        ValueInfoProto: what that would read back of ``onnx.helper.make_value_info(name,
        make_tensor_type_proto(elem_type, dims))`` (an int is a value, a non-empty string a symbol,
        anything else unknown), merged as it would be."""
        read = tuple([int(d) if isinstance(d, int) else (d if isinstance(d, str) and d else None) for d in dims])
        self._merge(name, (elem_type, read))

    def _lookup(self, name: str):
        info = self._info.get(name)
        if info is not None and info[1] is not None:
            return info
        grad_of = base_of_gradient(name)
        if grad_of is not None:
            base = self._info.get(grad_of)
            if base is not None and base[1] is not None:
                return base
        return info

    def __contains__(self, name: object) -> bool:
        """Whether anything (an element type, maybe a shape) is known of tensor ``name`` itself."""
        return name in self._info

    def elem_type(self, name: str) -> int | None:
        info = self._lookup(name)
        return info[0] if info else None

    def shape(self, name: str) -> tuple[Dim, ...] | None:
        """The shape with bound symbols replaced by their values; None if the rank is unknown."""
        info = self._lookup(name)
        if info is None or info[1] is None:
            return None
        return tuple(self.dims.get(d, d) if isinstance(d, str) else d for d in info[1])

    def nbytes(self, name: str) -> int | None:
        """Size in bytes, or None when the shape or element type is unknown or symbolic."""
        value = self._nbytes.get(name, _UNSEEN)
        if value is _UNSEEN:
            value = self._nbytes[name] = self._compute_nbytes(name)
        return value  # type: ignore[return-value]

    def _compute_nbytes(self, name: str) -> int | None:
        info = self._lookup(name)
        if info is None or info[1] is None:
            return None
        return self._bytes_of(info)

    def _bytes_of(self, info: tuple[int, tuple[Dim, ...]]) -> int | None:
        """The bytes of a tensor of ``info`` (element type, dims): None where the element size or a
        dimension is unknown."""
        et = info[0]
        itemsize = _ITEMSIZE[et] if et in _ITEMSIZE else _ITEMSIZE.setdefault(et, dtype_size(et))
        if itemsize is None:
            return None
        count = 1
        bound = self.dims
        for d in info[1]:  # as shape(name), without building the tuple
            if isinstance(d, str):
                d = bound.get(d, d)
            if not isinstance(d, int):
                return None
            count *= d
        return count * itemsize

    # -- hooks for the memory estimator (onnx_remat.estimate); they leave the lookups above as they are --

    def copy(self, *, memos: bool = True) -> TensorSizes:
        """An independent copy: value infos added to it leave this one unchanged. ``memos=False``
        leaves out the memoized sizes (for a copy about to gain shapes, which would empty them)."""
        new = TensorSizes.__new__(TensorSizes)
        new.dims = dict(self.dims)
        new._info = dict(self._info)
        new._nbytes = dict(self._nbytes) if memos else {}
        new._declared_keys = dict(self._declared_keys) if memos else {}
        new.inference_error = self.inference_error
        return new

    def declared(self, name: str) -> bool:
        """True when the shape of ``name`` is known from the model, shape inference or added value
        infos (what onnxruntime's own inference knows too); False when it is unknown or only the
        ``<tensor>_grad`` naming rule gives it."""
        info = self._info.get(name)
        return info is not None and info[1] is not None

    def plan_facts(
        self, names: Iterable[str]
    ) -> tuple[list[int | None], list[bool], list[tuple[int, tuple[Dim, ...]] | None]]:
        """For each of ``names``, in one pass: :meth:`nbytes`, :meth:`declared` and
        :meth:`declared_type_and_dims` (the compiled memory planner asks them for every tensor of a
        graph: onnx_remat.ortsim.plan_arrays). Each distinct declared shape is sized once; nothing
        is memoized (a rewrite's sizes are asked once per graph)."""
        info_of = self._info.get
        by_info: dict[tuple, int | None] = {}  # a declared (element type, dims) -> its bytes
        nbytes: list[int | None] = []
        declared: list[bool] = []
        keys: list[tuple[int, tuple[Dim, ...]] | None] = []
        for name in names:
            info = info_of(name)
            if info is not None and info[1] is not None:
                declared.append(True)
                shape = cast("tuple[int, tuple[Dim, ...]]", info)  # (its dims checked: no tuple made per name)
                keys.append(shape if info[0] else None)
                size = by_info.get(shape, _UNSEEN)
                if size is _UNSEEN:
                    size = by_info[shape] = self._bytes_of(shape)
                nbytes.append(size)  # type: ignore[arg-type]
            else:
                declared.append(False)
                keys.append(None)
                nbytes.append(self.nbytes(name))  # (the <tensor>_grad rule, or unknown)
        return nbytes, declared, keys

    def declared_type_and_dims(self, name: str) -> tuple[int, tuple[Dim, ...]] | None:
        """``(element type, dims as declared)`` when :meth:`declared` and the type is known, else None.
        Memoized: onnxruntime's planner asks for it for every tensor of every plan the emulation makes."""
        if name in self._declared_keys:
            return self._declared_keys[name]
        info = self._info.get(name) if self.declared(name) else None
        value = self._declared_keys[name] = (info[0], info[1]) if info and info[0] and info[1] is not None else None
        return value

    def raw_dims(self, name: str) -> tuple[Dim, ...] | None:
        """The shape as declared, symbolic dimensions left as their names (None if the rank is unknown)."""
        info = self._lookup(name)
        return None if info is None else info[1]

    def unbound_symbols(self, names: Iterable[str]) -> set[str]:
        """The symbolic dimensions (without a value in ``dims``) that the given tensors use."""
        symbols: set[str] = set()
        for name in names:
            info = self._lookup(name)
            if info and info[1]:
                symbols.update(d for d in info[1] if isinstance(d, str) and d not in self.dims)
        return symbols
