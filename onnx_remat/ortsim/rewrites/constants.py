"""``ConstantSharing`` (equal small constant initializers become one) and ``ConstantFolding``
(nodes whose inputs are all constant are evaluated; a ``Shape`` of a statically shaped tensor
becomes a constant, and the nodes that fed only that Shape go)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from onnx_remat.graph.conventions import MS_DOMAIN as MS
from onnx_remat.ortsim.graph import NOT_MERGED, RuntimeGraph, RuntimeNode, constant_value, element_count
from onnx_remat.ortsim.rewrites.base import GraphPass

# ConstantSharing's limits in onnxruntime 1.19 (measured: two Reshapes of one tensor by equal
# shape initializers of 8 int64 elements become one node after CSE, of 9 stay two; a 2x2
# initializer is not shared, nor a scalar with a one-element vector).
_SHARED_TYPES = frozenset(
    {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.DOUBLE,
        onnx.TensorProto.INT32,
        onnx.TensorProto.INT64,
    }
)


_SHARED_MAX_ELEMENTS = 8


def _constant_sharing(rg: RuntimeGraph) -> bool:
    """``ConstantSharing``: constant initializers (not graph inputs) of rank 0 or 1 with at most 8
    elements and equal type, rank and values are replaced by one of them, so that
    ``CommonSubexpressionElimination`` sees their readers' inputs as equal (e.g. the per-layer
    ``A_target_shape`` initializers of the gradient builder's Reshapes)."""
    shared: dict[tuple, str] = {}
    changed = False
    for name in sorted(rg.constants):
        if not rg.consumers.get(name):
            continue
        t = rg.initializers.get(name)
        if t is None or t.data_type not in _SHARED_TYPES or len(t.dims) > 1:
            continue
        if element_count(t.dims) > _SHARED_MAX_ELEMENTS:
            continue  # its value would have that many elements: not read
        value = constant_value(rg, name)
        if value is None or value.size > _SHARED_MAX_ELEMENTS:
            continue
        key = (t.data_type, len(t.dims), np.ascontiguousarray(value).tobytes())
        first = shared.setdefault(key, name)
        if first != name:
            rg.rewire(name, first)
            changed = True
    if changed:
        rg.rewrites["ConstantSharing"] += 1
    return changed


def _constant_folding(rg: RuntimeGraph) -> bool:
    """``ConstantFolding``: nodes whose inputs are all constant become initializers; so does the
    ``Shape`` of a tensor whose shape is fully static."""
    changed = False
    nodes, constants = rg.nodes, rg.constants
    for i in rg.default_order():
        node = nodes[i]
        if node is None:
            continue
        is_shape = node.op == "Shape" and node.domain == ""
        first = node.inputs[0] if node.inputs else ""
        if not is_shape and first and first not in constants:
            continue  # the common case, tested first: an input is computed
        if node.op in NOT_MERGED or rg.produces_graph_output(node):
            continue
        if is_shape:
            src = node.inputs[0]
            dims = rg.sizes.raw_dims(src) if rg.sizes.declared(src) else None
            if dims is None or any(not isinstance(d, int) or d <= 0 for d in dims):
                continue
            start, end = node.attrs.get("start", 0), node.attrs.get("end", None)
            value = np.array(list(dims)[slice(start, end)], dtype=np.int64)
            producer = rg.node_of(src)
            _fold(rg, node, [value])
            _remove_dead_upstream(rg, producer)
            changed = True
            continue
        ins = [t for t in node.inputs if t]
        if not ins or not all(rg.is_constant(t) for t in ins) or node.domain not in ("", MS):
            continue
        values = _evaluate(rg, node)
        _fold(rg, node, values)
        changed = True
    return changed


def _remove_dead_upstream(rg: RuntimeGraph, start: RuntimeNode | None) -> None:
    """After folding a node, ConstantFolding removes the chain of nodes above it that fed only it
    (``RemoveNodesWithOneOutputBottomUp``; measured: a chain Neg -> Relu -> Neg -> Shape goes
    entirely, a producer whose output another node reads stays). Such chains appear in rewritten
    graphs: a clone whose only reader is the Shape of a gradient builder."""
    stack = [start] if start is not None else []
    while stack:
        node = stack.pop()
        if rg.nodes[node.index] is None or rg.produces_graph_output(node):
            continue
        if any(rg.consumers.get(o) for o in node.outputs if o):
            continue
        rg.remove(node)
        for t in node.inputs:
            p = rg.node_of(t) if t else None
            if p is not None:
                stack.append(p)


def _fold(rg: RuntimeGraph, node: RuntimeNode, values: list[np.ndarray | None]) -> None:
    rg.remove(node)
    for k, o in enumerate(node.outputs):
        if not o:
            continue
        v = values[k] if k < len(values) else None
        if v is not None and v.size <= 64:
            t = numpy_helper.from_array(np.asarray(v), o)
        else:
            et = rg.sizes.elem_type(o) or onnx.TensorProto.FLOAT
            dims = rg.sizes.shape(o) or ()
            t = onnx.TensorProto(name=o, data_type=et, dims=[d if isinstance(d, int) else 0 for d in dims])
        rg.initializers[o] = t
        rg.constants.add(o)
        rg._values[o] = np.asarray(v) if v is not None and np.asarray(v).size <= 64 else None
    rg.rewrites["ConstantFolding"] += 1


def _evaluate(rg: RuntimeGraph, node: RuntimeNode) -> list[np.ndarray | None]:
    """Values of a folded node's outputs where cheap to compute (small scalar arithmetic), else None."""
    maybe = [constant_value(rg, t) for t in node.inputs if t]
    vals = [v for v in maybe if v is not None]
    if len(vals) != len(maybe):
        return [None] * len(node.outputs)
    ops = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Pow": np.power}
    try:
        if node.op in ops and len(vals) == 2:
            r = ops[node.op](vals[0], vals[1])
            if node.op == "Div" and np.issubdtype(vals[0].dtype, np.integer):
                r = vals[0] // vals[1]
            return [np.asarray(r, dtype=vals[0].dtype)]
        if node.op == "Size":
            return [np.array(vals[0].size, dtype=np.int64)]
        if node.op == "Neg":
            return [-vals[0]]
        if node.op == "Identity":
            return [vals[0]]
    except (ValueError, TypeError, ZeroDivisionError, FloatingPointError):
        pass
    return [None] * len(node.outputs)


class ConstantSharing(GraphPass):
    name = "ConstantSharing"

    def apply(self, rg: RuntimeGraph) -> bool:
        return _constant_sharing(rg)


class ConstantFolding(GraphPass):
    name = "ConstantFolding"

    def apply(self, rg: RuntimeGraph) -> bool:
        return _constant_folding(rg)
