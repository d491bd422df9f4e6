"""Rules on ``Gemm`` nodes: ``GemmTransposeFusion`` (a matrix Transpose feeding a Gemm becomes its
``transA`` / ``transB``; levels 1 and 2) and ``GemmSumFusion`` (level 1: a ``Sum`` of a Gemm and a
bias-shaped tensor becomes one Gemm with that bias, so the Gemm's own output never exists)."""

from __future__ import annotations

from onnx_remat.ortsim.graph import RuntimeGraph, RuntimeNode
from onnx_remat.ortsim.rewrites.base import NodeRule


def _is_matrix_transpose(rg: RuntimeGraph, node: RuntimeNode) -> bool:
    dims = rg.sizes.raw_dims(node.inputs[0]) if rg.sizes.declared(node.inputs[0]) else None
    if dims is not None and len(dims) != 2:
        return False
    perm = node.attrs.get("perm")
    if perm is None:
        return dims is not None
    return list(perm) == [1, 0]


def _gemm_transpose_fusion(rg: RuntimeGraph, gemm: RuntimeNode) -> bool:
    """``GemmTransposeFusion``: fold 2-D Transposes of Gemm's inputs (or of its output) into transA/transB."""
    if rg.output_edge_count(gemm) > 1:
        return False

    def fusable_input(k: int) -> RuntimeNode | None:
        if k >= len(gemm.inputs) or not gemm.inputs[k]:
            return None
        t = rg.node_of(gemm.inputs[k])
        if t is None or t.key != ("", "Transpose") or rg.produces_graph_output(t) or not _is_matrix_transpose(rg, t):
            return None
        readers = rg.consumers.get(t.outputs[0], ())
        if all((n := rg.nodes[r]) is not None and n.key == ("", "Gemm") for r in readers):
            return t
        return None

    a_t, b_t = fusable_input(0), fusable_input(1)
    out_t = None
    if len([t for t in gemm.inputs if t]) <= 2 and not rg.produces_graph_output(gemm):
        readers = rg.consumers.get(gemm.outputs[0], ())
        if len(readers) == 1:
            cand = rg.nodes[readers[0]]
            if (
                cand is not None
                and cand.key == ("", "Transpose")
                and len(rg.producers_of(cand)) == 1
                and _is_matrix_transpose(rg, cand)
            ):
                out_t = cand
    if a_t is None and b_t is None and out_t is None:
        return False
    trans_a, trans_b = bool(gemm.attrs.get("transA", 0)), bool(gemm.attrs.get("transB", 0))
    inputs = list(gemm.inputs)
    removed: list[RuntimeNode] = []
    origin = list(gemm.origin)
    for k, t in ((0, a_t), (1, b_t)):
        if t is None:
            continue
        if k == 0:
            trans_a = not trans_a
        else:
            trans_b = not trans_b
        inputs[k] = t.inputs[0]
        if len(rg.consumers.get(t.outputs[0], ())) <= 1:
            removed.append(t)
            origin += t.origin
    outputs = list(gemm.outputs)
    if out_t is not None:
        inputs[0], inputs[1] = inputs[1], inputs[0]
        trans_a, trans_b = not trans_b, not trans_a
        outputs = list(out_t.outputs)
        removed.append(out_t)
        origin += out_t.origin
    attrs = dict(gemm.attrs, transA=int(trans_a), transB=int(trans_b))
    rg.remove(gemm)
    for t in removed:
        rg.remove(t)
    rg.add(gemm.name + "/GemmTransposeFusion/", "Gemm", "", inputs, outputs, attrs, origin)
    rg.rewrites["GemmTransposeFusion"] += 1
    return True


def _gemm_sum_fusion(rg: RuntimeGraph, gemm: RuntimeNode) -> bool:
    """``GemmSumFusion`` (level 1, tried before GemmTransposeFusion): a Gemm without C whose only
    reader is a two-input Sum becomes one Gemm (new node, beta 1) adding the Sum's other input as
    C, when that input broadcasts one-way to the (M, N) output: (N), (1, N), (M, 1), (M, N). The
    tied-embedding gradient is the case met: the fused Gemm is appended, so it runs last."""
    inputs = [t for t in gemm.inputs if t]
    if len(gemm.inputs) != 2 or len(inputs) != 2 or rg.produces_graph_output(gemm):
        return False
    out = gemm.outputs[0]
    readers = rg.consumers.get(out, ())
    if len(readers) != 1 or rg.output_edge_count(gemm) != 1:
        return False
    total = rg.nodes[readers[0]]
    if total is None or total.key != ("", "Sum") or len(total.inputs) != 2:
        return False
    other = total.inputs[1] if total.inputs[0] == out else total.inputs[0]
    dims = rg.sizes.raw_dims(out) if rg.sizes.declared(out) else None
    bias = rg.sizes.raw_dims(other) if (other and rg.sizes.declared(other)) else None
    if dims is None or bias is None or len(dims) != 2:
        return False
    m, n = dims
    if not (bias == (n,) or bias == (1, n) or (len(bias) == 2 and bias[0] == m and bias[1] in (1, n))):
        return False
    attrs = {
        "transA": int(gemm.attrs.get("transA", 0)),
        "transB": int(gemm.attrs.get("transB", 0)),
        "alpha": float(gemm.attrs.get("alpha", 1.0)),
        "beta": 1.0,
    }
    rg.remove(gemm)
    rg.remove(total)
    rg.add(
        gemm.name + "/GemmSumFusion/",
        "Gemm",
        "",
        [gemm.inputs[0], gemm.inputs[1], other],
        list(total.outputs),
        attrs,
        gemm.origin + total.origin,
    )
    rg.rewrites["GemmSumFusion"] += 1
    return True


class GemmTransposeFusion(NodeRule):
    name = "GemmTransposeFusion"
    ops = frozenset({("", "Gemm")})

    def apply(self, rg: RuntimeGraph, node: RuntimeNode) -> bool:
        return _gemm_transpose_fusion(rg, node)


class GemmSumFusion(NodeRule):
    name = "GemmSumFusion"
    ops = frozenset({("", "Gemm")})

    def apply(self, rg: RuntimeGraph, node: RuntimeNode) -> bool:
        return _gemm_sum_fusion(rg, node)
