"""Level-2 fusions into ``com.microsoft::FusedMatMul``: ``MatmulTransposeFusion`` (a Transpose of
the last two axes, or of the batch axis, becomes ``transA`` / ``transB`` / ``transBatch*``) and
``MatMulScaleFusion`` (a Mul/Div by a scalar constant before a MatMul, or after one when it is the
product's only reader, becomes ``alpha``)."""

from __future__ import annotations

import numpy as np
import onnx

from onnx_remat.graph.conventions import MS_DOMAIN as MS
from onnx_remat.ortsim.graph import FLOAT_TYPES, RuntimeGraph, RuntimeNode, constant_value, rank
from onnx_remat.ortsim.rewrites.base import GraphPass

_MATMUL_OPS = frozenset({"MatMul", "FusedMatMul"})  # the op types both walks look at (any domain)


def _transpose_for_matmul(rg: RuntimeGraph, tensor: str) -> tuple[RuntimeNode, bool, bool] | None:
    """The Transpose producing ``tensor`` if MatmulTransposeFusion can fold it: (node, trans, trans_batch)."""
    t = rg.node_of(tensor)
    if t is None or t.key != ("", "Transpose") or rg.produces_graph_output(t):
        return None
    perm = t.attrs.get("perm")
    if perm is None:
        dims = rg.sizes.raw_dims(t.inputs[0]) if rg.sizes.declared(t.inputs[0]) else None
        if dims is None:
            return None
        perm = list(reversed(range(len(dims))))
    perm = list(perm)
    rank = len(perm)
    if rank < 2:
        return None
    last = rank - 1
    if perm[rank - 1] == last:
        last_index = rank - 1
    elif perm[rank - 2] == last:
        last_index = rank - 2
    else:
        return None
    if rank >= 3:
        if perm[0] not in (0, 1):
            return None
        for k in range(rank - 3):
            if perm[k] + 1 != perm[k + 1]:
                return None
    return t, last_index == rank - 2, rank >= 3 and perm[0] == 1


def _matmul_transpose_fusion(rg: RuntimeGraph) -> bool:
    """``MatmulTransposeFusion``: MatMul / FusedMatMul reading a Transpose becomes a FusedMatMul
    with transA/transB (transBatchA/B); the Transpose goes once no other node reads it."""
    changed = False
    consumer_count: dict[str, int] = {}
    removed: list[RuntimeNode] = []

    def still_needed(tensor: str) -> bool:
        if tensor not in consumer_count:
            consumer_count[tensor] = len(rg.consumer_nodes(tensor)) - 1
        else:
            consumer_count[tensor] -= 1
        return consumer_count[tensor] != 0

    for i in rg.default_order():
        node = rg.nodes[i]
        if node is None or node.op not in _MATMUL_OPS:
            continue  # the common case, without building the node's key
        is_fused = node.key == (MS, "FusedMatMul")
        if not (node.key == ("", "MatMul") or is_fused) or len(node.inputs) < 2:
            continue
        if any(
            rg.sizes.elem_type(t) not in FLOAT_TYPES + (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
            for t in node.inputs[:2]
        ):
            continue
        left = None if (is_fused and node.attrs.get("transBatchA", 0)) else _transpose_for_matmul(rg, node.inputs[0])
        right = None if (is_fused and node.attrs.get("transBatchB", 0)) else _transpose_for_matmul(rg, node.inputs[1])
        if (left and left[2]) or (right and right[2]):
            ra, rb = rank(rg, node.inputs[0]), rank(rg, node.inputs[1])
            if ra is None or rb is None or ra != rb:
                if left and left[2]:
                    left = None
                if right and right[2]:
                    right = None
        if not left and not right:
            continue
        inputs = list(node.inputs[:2])
        origin = list(node.origin)
        ta = tb = tba = tbb = False
        if left:
            if not still_needed(inputs[0]):
                removed.insert(0, left[0])
                origin += left[0].origin
            inputs[0] = left[0].inputs[0]
            ta, tba = left[1], left[2]
        if right:
            if not still_needed(inputs[1]):
                removed.insert(0, right[0])
                origin += right[0].origin
            inputs[1] = right[0].inputs[0]
            tb, tbb = right[1], right[2]
        alpha = 1.0
        if is_fused:
            ta ^= bool(node.attrs.get("transA", 0))
            tb ^= bool(node.attrs.get("transB", 0))
            tba ^= bool(node.attrs.get("transBatchA", 0))
            tbb ^= bool(node.attrs.get("transBatchB", 0))
            alpha = node.attrs.get("alpha", 1.0)
        attrs = {"transA": int(ta), "transB": int(tb), "transBatchA": int(tba), "transBatchB": int(tbb), "alpha": alpha}
        rg.remove(node)
        rg.add(node.name + "/MatmulTransposeFusion/", "FusedMatMul", MS, inputs, list(node.outputs[:1]), attrs, origin)
        rg.rewrites["MatmulTransposeFusion"] += 1
        changed = True
    for t in removed:
        if rg.nodes[t.index] is not None:
            rg.remove(t)
    return changed


def _scalar_scale(rg: RuntimeGraph, node: RuntimeNode) -> tuple[float, int] | None:
    """(scale, index of the scale input) if ``node`` is a Mul or Div by a scalar constant."""
    if node.domain != "" or node.op not in ("Mul", "Div") or len(node.inputs) != 2:
        return None
    candidates = (1,) if node.op == "Div" else (0, 1)
    for k in candidates:
        c, other = node.inputs[k], node.inputs[1 - k]
        if not rg.is_constant(c):
            continue
        dims = rg.sizes.raw_dims(c)
        if dims is None:
            t = rg.initializers.get(c)
            dims = tuple(t.dims) if t is not None else None
        if dims is None or int(np.prod([d if isinstance(d, int) else 0 for d in dims], dtype=np.int64)) != 1:
            continue
        other_rank = rank(rg, other) or 0
        if len(dims) > other_rank:
            continue
        value = constant_value(rg, c)
        if value is None:
            continue
        v = float(np.asarray(value).reshape(-1)[0])
        if node.op == "Div":
            if v == 0:
                return None
            v = 1.0 / v
        return v, k
    return None


def _matmul_scale_fusion(rg: RuntimeGraph) -> bool:
    """``MatMulScaleFusion``: Mul/Div by a scalar constant feeding a MatMul (or fed by one, when it
    is the MatMul's only reader) is folded into a FusedMatMul's alpha."""
    changed = False
    for i in rg.default_order():
        node = rg.nodes[i]
        if node is None or node.op not in _MATMUL_OPS:
            continue  # the common case, without building the node's key
        if not (node.key == ("", "MatMul") or node.key == (MS, "FusedMatMul")):
            continue
        if any(rg.sizes.elem_type(t) not in FLOAT_TYPES for t in node.inputs[:2]):
            continue
        input_merges: list[tuple[int, RuntimeNode, int, float]] = []  # (input k, scale node, kept input, scale)
        for k, t in enumerate(node.inputs[:2]):
            p = rg.node_of(t) if t else None
            if p is None:
                continue
            s = _scalar_scale(rg, p)
            if s is None:
                continue
            keep = 1 - s[1]
            dims = rg.sizes.raw_dims(p.inputs[keep]) if rg.sizes.declared(p.inputs[keep]) else None
            if not dims:
                continue
            input_merges.append((k, p, keep, s[0]))
        output_merge: tuple[RuntimeNode, float] | None = None
        out = node.outputs[0]
        readers = rg.consumers.get(out, ())
        if len(readers) == 1 and not rg.produces_graph_output(node):
            r = rg.nodes[readers[0]]
            s = _scalar_scale(rg, r) if r is not None else None
            if r is not None and s is not None and r.inputs[1 - s[1]] == out:
                output_merge = (r, s[0])
        if not input_merges and output_merge is None:
            continue
        attrs = dict(node.attrs) if node.op == "FusedMatMul" else {}
        alpha = float(attrs.get("alpha", 1.0))
        inputs = list(node.inputs)
        outputs = list(node.outputs)
        origin = list(node.origin)
        for k, p, keep, scale in input_merges:
            alpha *= scale
            inputs[k] = p.inputs[keep]
        if output_merge is not None:
            alpha *= output_merge[1]
            outputs = [output_merge[0].outputs[0]]
        attrs["alpha"] = float(np.float32(alpha))
        rg.remove(node)
        for _k, p, _keep, _scale in input_merges:
            if rg.nodes[p.index] is not None and not rg.consumers.get(p.outputs[0]) and not rg.produces_graph_output(p):
                rg.remove(p)
                origin += p.origin
        if output_merge is not None:
            rg.remove(output_merge[0])
            origin += output_merge[0].origin
        name = node.name + "/MatMulScaleFusion/"
        rg.add(name, "FusedMatMul", MS, inputs, outputs, attrs, origin)
        rg.rewrites["MatMulScaleFusion"] += 1
        changed = True
    return changed


class MatmulTransposeFusion(GraphPass):
    name = "MatmulTransposeFusion"
    ops = (("", "Transpose"),)

    def apply(self, rg: RuntimeGraph) -> bool:
        return _matmul_transpose_fusion(rg)


class MatMulScaleFusion(GraphPass):
    name = "MatMulScaleFusion"
    ops = (("", "MatMul"), (MS, "FusedMatMul"))

    def apply(self, rg: RuntimeGraph) -> bool:
        return _matmul_scale_fusion(rg)
