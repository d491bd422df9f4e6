"""Feeds for one training step: which graph inputs are what, and their values.

A training graph written by ``onnxruntime.training.artifacts.generate_artifacts`` has four kinds
of inputs (:func:`classify_inputs`):

* *data*: the model's inputs and the loss target (``x``, ``input_ids``, ``labels``);
* *parameters*: every trainable parameter ``P`` (its value lives in the artifacts checkpoint),
  recognised by the matching gradient buffer input;
* *gradient buffers* ``P_grad.accumulation.buffer``: fed zeros the shape of ``P``;
* the flag ``lazy_reset_grad``: fed ``[True]`` so a step's gradients are not added to old ones.

Any other graph is all data inputs. Data inputs are synthesized deterministically from a seed
(:func:`prepare_feeds`) or read from an ``.npz`` file and checked against the graph. Integer inputs
(token ids, class labels) are drawn from a range where every value is valid: the row count of the
embedding table a ``Gather`` reads, the class count of a cross-entropy's scores, an ``OneHot``'s
depth (:func:`infer_int_ranges`), or what the user gives. Symbolic dimensions take their values
from ``dims`` or from the arrays of the file.

Everything here raises :class:`~onnx_remat.errors.RematError` with one line naming what to fix.
"""

from __future__ import annotations

import difflib
import json
import os
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from onnx_remat.errors import RematError
from onnx_remat.graph.conventions import BUFFER_SUFFIX, RESET_FLAG, parameter_of_buffer

if TYPE_CHECKING:
    from onnx_remat.analysis.sizes import TensorSizes

DATA, PARAMETER, BUFFER, FLAG = "data", "parameter", "gradient_buffer", "reset_flag"

# Ops a integer input may pass through unchanged in value before it is used as an index.
_VALUE_PRESERVING = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Cast", "Expand"})
_LOSS_OPS = frozenset({"SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLossInternal"})
DEFAULT_INT_RANGE = (0, 2)

Dim = int | str | None


@dataclass
class GraphInput:
    """One graph input: name, ONNX element type, declared dims (None: rank unknown) and role."""

    name: str
    elem_type: int
    dims: tuple[Dim, ...] | None
    role: str = DATA

    @property
    def dtype(self) -> np.dtype | None:
        """The numpy dtype of the input, or None where numpy has none (bfloat16, strings)."""
        try:
            dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(self.elem_type))
        except (KeyError, TypeError, ValueError):
            return None
        return None if dt.kind in "OUSV" else dt

    @property
    def type_name(self) -> str:
        """``float32``, ``int64``, ... (the ONNX name where numpy has none)."""
        dt = self.dtype
        return str(dt) if dt is not None else onnx.TensorProto.DataType.Name(self.elem_type).lower()


@dataclass
class TrainingInputs:
    """The graph's inputs by role, in graph order."""

    data: list[GraphInput] = field(default_factory=list)
    parameters: list[GraphInput] = field(default_factory=list)
    buffers: list[GraphInput] = field(default_factory=list)
    flags: list[GraphInput] = field(default_factory=list)

    def all(self) -> list[GraphInput]:
        """Every input, grouped by role."""
        return self.data + self.parameters + self.buffers + self.flags

    def buffer_of(self, buffer: str) -> str:
        """The parameter a gradient buffer belongs to."""
        return parameter_of_buffer(buffer) or buffer


@dataclass
class InputInfo:
    """How one fed array was made, for reports: shape, dtype, source and integer range."""

    shape: tuple[int, ...]
    dtype: str
    source: str  # "synthesized", "file", "checkpoint"
    int_range: tuple[int, int] | None = None
    range_source: str | None = None

    def to_json(self) -> dict:
        """JSON form: ``{"shape", "dtype", "source", "int_range", "range_source"}``."""
        return {
            "shape": list(self.shape),
            "dtype": self.dtype,
            "source": self.source,
            "int_range": list(self.int_range) if self.int_range else None,
            "range_source": self.range_source,
        }


@dataclass
class PreparedFeeds:
    """The arrays to feed (data inputs, and parameters not read from a checkpoint) and how.

    ``from_checkpoint`` names the parameters the worker must read from the checkpoint;
    ``buffers`` maps each gradient buffer to its parameter; ``flags`` are the reset flags.
    """

    arrays: dict[str, np.ndarray]
    info: dict[str, InputInfo]
    from_checkpoint: list[str]
    buffers: dict[str, str]
    flags: list[str]
    dims: dict[str, int]
    inputs: TrainingInputs

    def save(self, path: str | os.PathLike) -> Path:
        """Write the arrays to ``path`` (see :func:`save_arrays`)."""
        return save_arrays(path, self.arrays)


def save_arrays(path: str | os.PathLike, arrays: Mapping[str, np.ndarray]) -> Path:
    """Write named arrays to a zip of ``.npy`` files; unlike ``numpy.savez``, names may hold any character."""
    path = Path(path)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for i, arr in enumerate(arrays.values()):
            with zf.open(f"a{i}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asarray(arr), allow_pickle=False)
        zf.writestr("names.json", json.dumps(list(arrays)))
    return path


def load_arrays(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read arrays written by :func:`save_arrays`, in the order they were written."""
    with zipfile.ZipFile(path) as zf:
        names = json.loads(zf.read("names.json"))
        out = {}
        for i, name in enumerate(names):
            with zf.open(f"a{i}.npy") as f:
                out[name] = np.lib.format.read_array(f, allow_pickle=False)
    return out


# -- classification ------------------------------------------------------------------------------


def _dims_of(vi: onnx.ValueInfoProto) -> tuple[int, tuple[Dim, ...] | None]:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        raise RematError(f"graph input {vi.name!r} is not a tensor; onnx-remat can only feed tensors")
    if not tt.HasField("shape"):
        return tt.elem_type, None
    dims: list[Dim] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return tt.elem_type, tuple(dims)


def classify_inputs(model: onnx.ModelProto) -> TrainingInputs:
    """Sort the graph inputs (initializers excluded) into data, parameters, buffers and flags."""
    initializers = {t.name for t in model.graph.initializer}
    graph_inputs = [vi for vi in model.graph.input if vi.name not in initializers]
    names = {vi.name for vi in graph_inputs}
    out = TrainingInputs()
    for vi in graph_inputs:
        elem_type, dims = _dims_of(vi)
        gi = GraphInput(vi.name, elem_type, dims)
        if parameter_of_buffer(vi.name) in names:
            gi.role = BUFFER
            out.buffers.append(gi)
        elif vi.name + BUFFER_SUFFIX in names:
            gi.role = PARAMETER
            out.parameters.append(gi)
        elif vi.name == RESET_FLAG and elem_type == onnx.TensorProto.BOOL:
            gi.role = FLAG
            out.flags.append(gi)
        else:
            out.data.append(gi)
    return out


# -- shapes ----------------------------------------------------------------------------------------


def _dim_hint(symbols: list[str]) -> str:
    return " ".join(f"--dim {s}=VALUE" for s in symbols)


def resolve_shape(gi: GraphInput, dims: Mapping[str, int]) -> tuple[int, ...]:
    """The concrete shape of an input with symbols bound from ``dims``.

    Raises RematError when the rank is unknown or a dimension stays unbound.
    """
    if gi.dims is None:
        raise RematError(f"input {gi.name!r} has no declared shape; give its values in an --inputs .npz file")
    shape = []
    for k, d in enumerate(gi.dims):
        if isinstance(d, int):
            shape.append(d)
        elif isinstance(d, str) and d in dims:
            shape.append(int(dims[d]))
        else:
            what = repr(d) if d else f"dimension {k} (unnamed)"
            raise RematError(f"input {gi.name!r}: {what} has no value; give it with --dim or in --inputs")
    return tuple(shape)


def unbound_symbols(inputs: list[GraphInput], dims: Mapping[str, int]) -> dict[str, list[str]]:
    """Symbolic dimensions without a value: ``{symbol: [input names]}``, in order of appearance."""
    out: dict[str, list[str]] = {}
    for gi in inputs:
        for d in gi.dims or ():
            if isinstance(d, str) and d not in dims:
                out.setdefault(d, [])
                if gi.name not in out[d]:
                    out[d].append(gi.name)
    return out


def check_dims_bound(inputs: list[GraphInput], dims: Mapping[str, int]) -> None:
    """Raise one RematError listing every unbound symbolic dimension and the ``--dim`` to give."""
    missing = unbound_symbols(inputs, dims)
    unnamed = [gi.name for gi in inputs if gi.dims is not None and any(d is None for d in gi.dims)]
    if missing:
        listed = ", ".join(f"{s} (in {', '.join(names)})" for s, names in missing.items())
        raise RematError(f"symbolic dimensions without a value: {listed}; give them with {_dim_hint(list(missing))}")
    if unnamed:
        raise RematError(
            f"inputs with unnamed dynamic dimensions: {', '.join(unnamed)}; give their values in an --inputs .npz file"
        )
    norank = [gi.name for gi in inputs if gi.dims is None]
    if norank:
        raise RematError(
            f"inputs without a declared shape: {', '.join(norank)}; give their values in an --inputs .npz file"
        )


# -- integer ranges ----------------------------------------------------------------------------------


def infer_int_ranges(
    model: onnx.ModelProto, inputs: list[GraphInput], dims: Mapping[str, int] | None = None
) -> dict[str, tuple[tuple[int, int], str]]:
    """Valid value ranges ``[low, high)`` of integer data inputs, with where each came from.

    Follows each integer input through value-preserving ops (Reshape, Cast, ...) to the ops that
    index with it: ``Gather`` (indices < the gathered axis's size), ``SoftmaxCrossEntropyLoss``
    and ``NegativeLogLikelihoodLoss`` (labels < the class count, dimension 1 of the scores),
    ``OneHot`` (indices < depth, when constant). Several users: the tightest bound wins. Inputs
    with no such user get :data:`DEFAULT_INT_RANGE`.
    """
    int_inputs = [gi for gi in inputs if gi.dtype is not None and gi.dtype.kind in "iu"]
    if not int_inputs:
        return {}
    graph = model.graph
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            if name:
                consumers.setdefault(name, []).append(node)
    constants = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            for a in node.attribute:
                if a.name == "value":
                    constants[node.output[0]] = a.t
    shape_of = _ShapeOf(model, dims, constants)
    out: dict[str, tuple[tuple[int, int], str]] = {}
    for gi in int_inputs:
        bounds = _index_bounds(gi.name, consumers, shape_of, constants)
        if bounds:
            high, why = min(bounds, key=lambda b: b[0])
            out[gi.name] = ((0, high), why)
        else:
            out[gi.name] = (DEFAULT_INT_RANGE, "default: no Gather, cross-entropy or OneHot reads it")
    return out


class _ShapeOf:
    """The shape of a tensor an indexing op reads (``shape_of(name)``): a graph input's declared
    shape with ``dims`` bound, a constant's, else what :class:`~onnx_remat.analysis.sizes.TensorSizes`
    infers (built on first need only)."""

    def __init__(self, model: onnx.ModelProto, dims: Mapping[str, int] | None, constants: dict):
        self.model = model
        self.dims = dims
        self.constants = constants
        self.sizes: TensorSizes | None = None

    def __call__(self, name: str):
        dims = self.dims
        for vi in self.model.graph.input:
            if vi.name == name:
                _, d = _dims_of(vi)
                if d is not None:
                    return tuple((dims or {}).get(x, x) if isinstance(x, str) else x for x in d)
        if name in self.constants:
            return tuple(self.constants[name].dims)
        if self.sizes is None:
            from onnx_remat.analysis.sizes import TensorSizes

            self.sizes = TensorSizes(self.model, dims=dict(dims or {}))
        return self.sizes.shape(name)


def _index_bounds(name: str, consumers: dict[str, list[onnx.NodeProto]], shape_of, constants) -> list[tuple[int, str]]:
    """The bounds the ops indexing with input ``name`` set (:func:`_index_bound`), found through
    the value-preserving ops it passes."""
    bounds: list[tuple[int, str]] = []
    seen: set[str] = set()
    frontier = [name]
    while frontier:
        tensor = frontier.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        for node in consumers.get(tensor, []):
            if node.domain in ("", "ai.onnx") and node.op_type in _VALUE_PRESERVING and node.input[0] == tensor:
                frontier.extend(o for o in node.output if o)
                continue
            bound = _index_bound(node, tensor, shape_of, constants)
            if bound is not None:
                bounds.append(bound)
    return bounds


def _index_bound(node: onnx.NodeProto, tensor: str, shape_of, constants) -> tuple[int, str] | None:
    label = node.name or node.op_type
    if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == tensor:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        shape = shape_of(node.input[0])
        if shape and -len(shape) <= axis < len(shape) and isinstance(shape[axis], int) and shape[axis] > 0:
            what = "rows" if axis in (0, -len(shape)) else f"entries on axis {axis}"
            return shape[axis], f"{shape[axis]} {what} of {node.input[0]}, {label}"
    elif node.op_type in _LOSS_OPS and len(node.input) > 1 and node.input[1] == tensor:
        shape = shape_of(node.input[0])
        if shape and len(shape) >= 2 and isinstance(shape[1], int) and shape[1] > 0:
            return shape[1], f"{shape[1]} classes, {label}"
    elif node.op_type == "OneHot" and node.input and node.input[0] == tensor and len(node.input) > 1:
        depth = constants.get(node.input[1])
        if depth is not None:
            value = int(np.asarray(onnx.numpy_helper.to_array(depth)).reshape(-1)[0])
            if value > 0:
                return value, f"depth {value}, {label}"
    return None


# -- values ------------------------------------------------------------------------------------------


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(name.encode())])


def synthesize_array(
    gi: GraphInput, shape: tuple[int, ...], seed: int, int_range: tuple[int, int] | None = None
) -> np.ndarray:
    """Deterministic values for one data input: normal floats, integers in ``int_range``, True bools."""
    dt = gi.dtype
    if dt is None:
        raise RematError(f"input {gi.name!r} is {gi.type_name}, which onnx-remat cannot synthesize or feed")
    rng = _rng(seed, gi.name)
    if dt.kind == "f":
        return rng.standard_normal(shape, dtype=np.float32).astype(dt)
    if dt.kind in "iu":
        low, high = int_range or DEFAULT_INT_RANGE
        return rng.integers(low, high, size=shape, dtype=np.int64).astype(dt)
    if dt.kind == "b":
        return np.ones(shape, dtype=bool)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    raise RematError(f"input {gi.name!r} is {gi.type_name}, which onnx-remat cannot synthesize")


def synthesize_parameter(gi: GraphInput, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Deterministic parameter values: uniform in ``+-1/sqrt(fan_in)`` (PyTorch's Linear default)."""
    dt = gi.dtype
    if dt is None or dt.kind != "f":
        raise RematError(f"parameter {gi.name!r} is {gi.type_name}; only float parameters can be synthesized")
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else (shape[0] if shape else 1)
    bound = 1.0 / np.sqrt(max(fan_in, 1))
    return _rng(seed, "param:" + gi.name).uniform(-bound, bound, size=shape).astype(dt)


_ZIP_MAGIC = b"PK\x03\x04"
_NPY_MAGIC = b"\x93NUMPY"


def read_inputs_file(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Arrays of an ``.npz`` file (``numpy.savez``), as a dict; one-line error if unreadable.

    The first bytes are looked at before numpy is: an ``.npy`` (one array, no names) and
    anything that is not a zip archive get a message that says what the file is, not numpy's
    advice to unpickle it.
    """
    p = Path(path)
    if not p.exists():
        raise RematError(f"{p}: no such file (--inputs takes an .npz written by numpy.savez)")
    if not p.is_file():
        raise RematError(f"{p}: not a regular file (--inputs takes an .npz written by numpy.savez)")
    try:
        with open(p, "rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        raise RematError(f"{p}: cannot read ({exc.strerror})") from None
    if head.startswith(_NPY_MAGIC):
        raise RematError(
            f"{p}: an .npy file (one array without a name); --inputs takes an .npz with one array per graph "
            "input: numpy.savez(path, name=array, ...)"
        )
    if not head.startswith(_ZIP_MAGIC):
        raise RematError(f"{p}: not an .npz file (no zip archive); write one with numpy.savez(path, name=array, ...)")
    try:
        data = np.load(p, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ValueError("not an .npz archive")
        with data:
            return {k: data[k] for k in data.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError, KeyError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "pickle" in why:
            why = "an array of Python objects, which is not read"
        raise RematError(f"{p}: not an .npz file written by numpy.savez ({why})") from None


def _bind_from_arrays(
    where: str, inputs: list[GraphInput], arrays: Mapping[str, np.ndarray], dims: dict[str, int]
) -> None:
    """Check given arrays against declared shapes and dtypes, binding symbols from them."""
    for gi in inputs:
        if gi.name not in arrays:
            continue
        arr = arrays[gi.name]
        if gi.dtype is not None and arr.dtype != gi.dtype:
            raise RematError(f"{where}: {gi.name!r} is {arr.dtype}, the graph wants {gi.type_name}")
        if gi.dims is None:
            continue
        if arr.ndim != len(gi.dims):
            raise RematError(
                f"{where}: {gi.name!r} has shape {tuple(arr.shape)} ({arr.ndim} dimensions), "
                f"the graph wants {len(gi.dims)}: {_show_dims(gi.dims)}"
            )
        for k, (want, got) in enumerate(zip(gi.dims, arr.shape)):
            if isinstance(want, int) and want != got:
                raise RematError(
                    f"{where}: {gi.name!r} has shape {tuple(arr.shape)}, the graph wants {_show_dims(gi.dims)}"
                )
            if isinstance(want, str):
                if want in dims and dims[want] != got:
                    raise RematError(
                        f"{where}: {gi.name!r} has {want}={got} in dimension {k}, but {want}={dims[want]} "
                        "(from --dim or another input)"
                    )
                dims[want] = int(got)


def _show_dims(dims: tuple[Dim, ...]) -> str:
    return "(" + ", ".join(str(d) if d is not None else "?" for d in dims) + ")"


def _check_memory(inputs: list[GraphInput], dims: Mapping[str, int], given: Mapping[str, np.ndarray]) -> None:
    """Refuse feeds that cannot fit in this machine's memory (huge --dim values) before making them."""
    total = 0
    for gi in inputs:
        if gi.name in given or gi.dims is None or gi.dtype is None:
            continue
        n = 1
        for d in gi.dims:
            v = d if isinstance(d, int) else dims.get(d) if isinstance(d, str) else None
            if v is None:
                break
            n *= int(v)
        else:
            total += n * gi.dtype.itemsize
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    if total > memory:
        gib = 2**30
        raise RematError(
            f"the inputs alone would take {total / gib:.1f} GiB, more than this machine's {memory / gib:.1f} GiB "
            "of memory; give smaller --dim values"
        )


def prepare_feeds(
    model: onnx.ModelProto,
    *,
    dims: Mapping[str, int] | None = None,
    inputs: str | os.PathLike | Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
    int_ranges: Mapping[str, tuple[int, int]] | None = None,
    synthesize_parameters: bool = False,
) -> PreparedFeeds:
    """Everything one step of ``model`` is fed, except parameters read from a checkpoint.

    ``inputs`` (a path to an ``.npz`` or a dict of arrays) gives every data input, and may give
    parameters too; arrays are checked against the graph's names, dtypes and shapes. Otherwise data
    inputs are synthesized from ``seed``. Parameters not given are synthesized when
    ``synthesize_parameters`` is true, else listed in ``from_checkpoint``. ``int_ranges``
    overrides the inferred ``[low, high)`` of integer inputs.
    """
    from onnx_remat.model_io import check_dim_names

    check_dim_names(model, dims)
    roles = classify_inputs(model)
    bound: dict[str, int] = {k: int(v) for k, v in (dims or {}).items()}
    where = "--inputs"
    given: dict[str, np.ndarray] = {}
    if inputs is not None:
        if isinstance(inputs, Mapping):
            given = {k: np.asarray(v) for k, v in inputs.items()}
        else:
            where = str(inputs)
            given = read_inputs_file(inputs)
        feedable = {gi.name for gi in roles.data + roles.parameters}
        unknown = [k for k in given if k not in feedable]
        if unknown:
            hints = []
            for k in unknown:
                close = difflib.get_close_matches(k, feedable, n=1)
                hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise RematError(
                f"{where}: no graph input named {', '.join(hints)}; the graph's data inputs are: "
                + ", ".join(gi.name for gi in roles.data)
            )
        missing = [gi.name for gi in roles.data if gi.name not in given]
        if missing:
            raise RematError(
                f"{where}: lacks data input{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                f"(the graph's data inputs are: {', '.join(gi.name for gi in roles.data)})"
            )
        _bind_from_arrays(where, roles.data + roles.parameters, given, bound)

    ranges = {}
    if int_ranges:
        int_names = {gi.name for gi in roles.data if gi.dtype is not None and gi.dtype.kind in "iu"}
        for name, rng in int_ranges.items():
            if name not in int_names:
                raise RematError(
                    f"--int-range {name}: no integer data input of that name; integer inputs: "
                    + (", ".join(sorted(int_names)) or "none")
                )
            low, high = int(rng[0]), int(rng[1])
            if low >= high:
                raise RematError(f"--int-range {name}={low}:{high}: low must be below high (high is excluded)")
            gi = next(g for g in roles.data if g.name == name)
            info_ = np.iinfo(gi.dtype) if gi.dtype is not None else None
            if info_ is not None and (low < info_.min or high - 1 > info_.max):
                raise RematError(
                    f"--int-range {name}={low}:{high}: {name} is {gi.type_name}, which holds {info_.min}..{info_.max}"
                )
    to_make = [gi for gi in roles.data if gi.name not in given]
    check_dims_bound(to_make + [p for p in roles.parameters if p.name not in given and synthesize_parameters], bound)

    _check_memory(to_make + (roles.parameters if synthesize_parameters else []), bound, given)
    if to_make:
        ranges = infer_int_ranges(model, [gi for gi in to_make if not (int_ranges and gi.name in int_ranges)], bound)
    arrays: dict[str, np.ndarray] = {}
    info: dict[str, InputInfo] = {}
    for gi in roles.data:
        if gi.name in given:
            arr = given[gi.name]
            arrays[gi.name] = arr
            info[gi.name] = InputInfo(tuple(arr.shape), str(arr.dtype), "file")
            continue
        shape = resolve_shape(gi, bound)
        rng_, why = None, None
        if int_ranges and gi.name in int_ranges:
            rng_, why = (int(int_ranges[gi.name][0]), int(int_ranges[gi.name][1])), "given"
        elif gi.name in ranges:
            rng_, why = ranges[gi.name]
        arr = synthesize_array(gi, shape, seed, rng_)
        arrays[gi.name] = arr
        info[gi.name] = InputInfo(shape, gi.type_name, "synthesized", rng_, why)

    from_checkpoint: list[str] = []
    for gi in roles.parameters:
        if gi.name in given:
            arrays[gi.name] = given[gi.name]
            info[gi.name] = InputInfo(tuple(given[gi.name].shape), str(given[gi.name].dtype), "file")
        elif synthesize_parameters:
            shape = resolve_shape(gi, bound)
            arrays[gi.name] = synthesize_parameter(gi, shape, seed)
            info[gi.name] = InputInfo(shape, gi.type_name, "synthesized")
        else:
            from_checkpoint.append(gi.name)
    buffers = {b.name: roles.buffer_of(b.name) for b in roles.buffers}
    return PreparedFeeds(
        arrays=arrays,
        info=info,
        from_checkpoint=from_checkpoint,
        buffers=buffers,
        flags=[f.name for f in roles.flags],
        dims=bound,
        inputs=roles,
    )


def check_same_inputs(a: TrainingInputs, b: TrainingInputs, label_a: str = "A", label_b: str = "B") -> None:
    """Raise RematError when two graphs do not take the same data inputs and parameters."""
    for kind in ("data", "parameters"):
        da = {gi.name: gi for gi in getattr(a, kind)}
        db = {gi.name: gi for gi in getattr(b, kind)}
        only_a = [n for n in da if n not in db]
        only_b = [n for n in db if n not in da]
        if only_a or only_b:
            parts = []
            if only_a:
                parts.append(f"only {label_a} has {', '.join(only_a)}")
            if only_b:
                parts.append(f"only {label_b} has {', '.join(only_b)}")
            raise RematError(f"{label_a} and {label_b} take different {kind.replace('_', ' ')}: " + "; ".join(parts))
        for name, ga in da.items():
            gb = db[name]
            if ga.elem_type != gb.elem_type or ga.dims != gb.dims:
                raise RematError(
                    f"input {name!r} differs: {label_a} wants {ga.type_name} {_show_dims(ga.dims or ())}, "
                    f"{label_b} wants {gb.type_name} {_show_dims(gb.dims or ())}"
                )
