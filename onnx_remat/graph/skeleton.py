"""A model without its tensor data, for ONNX's C++ checker and shape inference.

Both take a serialized model: handed a ``ModelProto``, they serialize it whole, parse it in C++
and (shape inference) serialize and parse the result back, each a copy of every initializer. For a
model with gigabytes of weights that is gigabytes on top of the command's peak, for checks that
read the weights' types and dims only. :func:`skeleton_bytes` is what they get instead: the model's
opset imports, functions, graph declarations and nodes, its large initializers turned into typed
graph inputs.

The nodes go in as wire bytes, one ``NodeProto.SerializeToString()`` each, not as a copy in a new
``ModelProto``: protobuf's Python messages take several times their wire size (a third of a GiB
for 10^5 nodes). Only a node that changes is copied (:func:`skeleton_bytes`'s ``edit``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import onnx

# ModelProto.graph and GraphProto.node, both length-delimited fields: tag = field << 3 | 2
_MODEL_GRAPH_TAG = b"\x3a"  # field 7
_GRAPH_NODE_TAG = b"\x0a"  # field 1

_HEADER_FIELDS = ("ir_version", "producer_name", "producer_version", "domain", "model_version")


# Initializers up to this size go to shape inference with their data; larger ones as typed inputs
# only. Inference reads the values of shape-like tensors (a Reshape's shape, a Slice's starts, a
# Range's limits, position ids): small integer tensors, far below this. A weight's values never
# change an inferred shape, and copying them would cost a model's size twice over.
INFERENCE_DATA_BYTES = 64 * 1024


def skeleton_header(model: onnx.ModelProto, *, keep_data_upto: int = -1) -> onnx.ModelProto:
    """``model`` without its nodes and tensor data: opset imports, functions, the graph's name,
    inputs, outputs and value_info. Each initializer (sparse ones too) becomes a typed graph input
    (unless one is declared already), but those of at most ``keep_data_upto`` bytes, which are
    kept with their data (shape inference reads the values of small integer tensors: a Reshape's
    shape, a Slice's starts; never those of a weight). ``model`` is not changed."""
    header = onnx.ModelProto()
    for name in _HEADER_FIELDS:
        setattr(header, name, getattr(model, name))
    header.opset_import.extend(model.opset_import)
    header.functions.extend(model.functions)
    g, src = header.graph, model.graph
    g.name = src.name
    g.input.extend(src.input)
    g.output.extend(src.output)
    g.value_info.extend(src.value_info)
    declared = {vi.name for vi in src.input}
    for init in src.initializer:
        if keep_data_upto >= 0 and _data_bytes(init) <= keep_data_upto:
            g.initializer.append(init)
        elif init.name not in declared:
            g.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    for sparse in src.sparse_initializer:
        name = sparse.values.name
        if name not in declared:
            g.input.append(onnx.helper.make_tensor_value_info(name, sparse.values.data_type, list(sparse.dims)))
    return header


def skeleton_bytes(
    header: onnx.ModelProto,
    graph: onnx.GraphProto,
    edit: Callable[[onnx.NodeProto], onnx.NodeProto | None] | None = None,
) -> bytes:
    """The wire bytes of ``header`` (:func:`skeleton_header`) with ``graph``'s nodes as its nodes.

    ``edit``, where given, sees each node and returns an edited copy to put in its place, or None
    to keep the node as it is (``graph`` is not changed).

    Protobuf merges a message field met twice on the wire and appends to its repeated fields, so
    the header's serialization followed by a ``graph`` field holding only nodes parses as the
    header with those nodes, in order."""
    parts: list[bytes] = []
    size = 0
    for node in graph.node:
        edited = edit(node) if edit is not None else None
        data = (node if edited is None else edited).SerializeToString()
        head = _GRAPH_NODE_TAG + _varint(len(data))
        parts += (head, data)
        size += len(head) + len(data)
    return b"".join([header.SerializeToString(), _MODEL_GRAPH_TAG, _varint(size), *parts])


def _data_bytes(init: onnx.TensorProto) -> int:
    """The bytes an initializer's dims and element type declare (an element of unknown size, a
    string, counts 1 byte). Not read from the data: protobuf copies a bytes field to read it,
    and upb serializes a message to size it (each a copy of the weight on the peak)."""
    count = math.prod(init.dims)
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        itemsize = 1
    return count * max(itemsize, 1)


def _varint(value: int) -> bytes:
    """``value`` (>= 0) as a protobuf base-128 varint."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
