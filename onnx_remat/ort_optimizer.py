"""What onnxruntime 1.19 does to a training graph before it plans memory, emulated.

Input: an ``onnx.ModelProto`` (a training graph) and its tensor shapes
(:class:`~onnx_remat.shapes.TensorSizes`). Output: a :class:`RuntimeGraph`: the nodes onnxruntime
would execute, each with the *node index* onnxruntime gives it, which is what its execution
order depends on (:mod:`onnx_remat.exec_order`).

An ``InferenceSession`` (and the training ``Module``) with the default ``ORT_ENABLE_ALL`` level
rewrites the graph on CPU before planning. These rewrites change which tensors exist and the order
the rest runs in, so an estimate that ignored them is off by up to 17% on the example models
(measured: the MindSpore 10-Block network is planned at 215.0 MiB; its unoptimized graph would
need 251.5). Emulated here, in onnxruntime's order, each pass walking the graph in its current
DEFAULT execution order:

* at load: ``Constant`` nodes become initializers;
* level 1, repeated until nothing changes: ``EliminateIdentity``, ``CastElimination``,
  ``NoopElimination``, ``GemmSumFusion`` and ``GemmTransposeFusion`` (rules), ``ConstantSharing`` (equal constant
  initializers of up to 8 elements become one), ``CommonSubexpressionElimination``,
  ``ConstantFolding`` (nodes whose inputs are all constant, and ``Shape`` of a statically shaped
  tensor), and the ``TransposeOptimizer``'s merging of consecutive Transposes;
* level 2, repeated until nothing changes: ``GemmTransposeFusion``, ``MatmulTransposeFusion``
  (a Transpose of the last two axes, or of the batch axis, folded into ``FusedMatMul``),
  ``MatMulScaleFusion`` (Mul/Div by a scalar constant before or after a MatMul folded into
  ``FusedMatMul``'s alpha).

New nodes are appended (the next free index) and removed nodes leave holes, as in onnxruntime.
Not emulated (do not change the example graphs; see README for what that means elsewhere):
the rest of the TransposeOptimizer (pushing Transposes through other ops), the
remaining level-1 rules (slice/unsqueeze/expand/dropout elimination,
DivMulFusion, ...), ReshapeFusion, GeluFusion, LayerNormFusion, the level-2 fusions of other op
patterns, NCHWc layout (level 3) and every CUDA-only fusion. Every pass is linear (plus a sort
per node's producers); none recurses.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .exec_order import default_order, priority_order
from .shapes import TensorSizes

MS = "com.microsoft"
RANDOM_OPS = frozenset(
    {"Dropout", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
     "Bernoulli", "BiasDropout", "BitmaskDropout", "BitmaskBiasDropout", "DropoutGrad"}
)
_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)


@dataclass(eq=False)
class RuntimeNode:
    """One node as onnxruntime holds it: ``index`` orders the DEFAULT execution order."""

    index: int
    name: str
    op: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict
    origin: tuple[str, ...]  # names of the model's nodes this node stands for

    @property
    def key(self) -> tuple[str, str]:
        return (self.domain, self.op)


@dataclass
class RuntimeGraph:
    """The graph onnxruntime would run: nodes by index (``None`` where removed) and tensor facts."""

    nodes: list[RuntimeNode | None]
    graph_inputs: list[str]
    graph_outputs: list[str]
    initializers: dict[str, onnx.TensorProto]  # small constant values are kept, large ones empty
    constants: set[str]  # initializers that are not graph inputs (onnxruntime folds through them)
    sizes: TensorSizes
    rewrites: Counter = field(default_factory=Counter)
    producer: dict[str, int] = field(default_factory=dict, repr=False)
    consumers: dict[str, list[int]] = field(default_factory=dict, repr=False)
    graph_output_set: set[str] = field(default_factory=set, repr=False)
    _values: dict[str, np.ndarray | None] = field(default_factory=dict, repr=False)
    _prods: dict[int, list[int]] = field(default_factory=dict, repr=False)  # producers per node, kept valid by edits

    def __post_init__(self) -> None:
        self.graph_output_set = set(self.graph_outputs)

    # -- structure --------------------------------------------------------------------------

    def live(self) -> list[RuntimeNode]:
        return [n for n in self.nodes if n is not None]

    def reindex(self) -> None:
        """Rebuild the producer / consumer maps (one entry per input occurrence)."""
        self.producer = {}
        self.consumers = {}
        self._prods = {}
        for n in self.live():
            for o in n.outputs:
                if o:
                    self.producer[o] = n.index
            for t in n.inputs:
                if t:
                    self.consumers.setdefault(t, []).append(n.index)

    def producers_of(self, node: RuntimeNode) -> list[int]:
        """Indices of the nodes feeding ``node``, one per input edge."""
        cached = self._prods.get(node.index)
        if cached is None:
            prod = self.producer
            cached = [prod[t] for t in node.inputs if t in prod]
            self._prods[node.index] = cached
        return cached

    def _touch_readers(self, tensors: Iterable[str]) -> None:
        """Forget the cached producers of the nodes reading ``tensors`` (their producer changed)."""
        for t in tensors:
            for i in self.consumers.get(t, ()):
                self._prods.pop(i, None)

    def node_of(self, tensor: str) -> RuntimeNode | None:
        i = self.producer.get(tensor)
        return None if i is None else self.nodes[i]

    def consumer_nodes(self, tensor: str) -> list[int]:
        """Distinct consumer node indices of ``tensor``."""
        return list(dict.fromkeys(self.consumers.get(tensor, ())))

    def output_edge_count(self, node: RuntimeNode) -> int:
        return sum(len(self.consumers.get(o, ())) for o in node.outputs if o)

    def produces_graph_output(self, node: RuntimeNode) -> bool:
        outs = self.graph_output_set
        return any(o in outs for o in node.outputs)

    def has_op(self, *keys: tuple[str, str]) -> bool:
        """True if some live node has one of the (domain, op) ``keys``."""
        wanted = set(keys)
        return any(n is not None and (n.domain, n.op) in wanted for n in self.nodes)

    def is_constant(self, tensor: str) -> bool:
        return tensor in self.constants

    # -- edits that keep the maps consistent ------------------------------------------------

    def remove(self, node: RuntimeNode) -> None:
        self.nodes[node.index] = None
        self._prods.pop(node.index, None)
        self._touch_readers(o for o in node.outputs if o)
        for o in node.outputs:
            if o and self.producer.get(o) == node.index:
                del self.producer[o]
        for t in node.inputs:
            if t:
                lst = self.consumers.get(t)
                if lst and node.index in lst:
                    lst.remove(node.index)

    def add(self, name: str, op: str, domain: str, inputs: list[str], outputs: list[str], attrs: dict,
            origin: Iterable[str]) -> RuntimeNode:
        node = RuntimeNode(len(self.nodes), name, op, domain, list(inputs), list(outputs), dict(attrs), tuple(origin))
        self.nodes.append(node)
        self._touch_readers(o for o in node.outputs if o)
        for o in node.outputs:
            if o:
                self.producer[o] = node.index
        for t in node.inputs:
            if t:
                self.consumers.setdefault(t, []).append(node.index)
        return node

    def replace_input(self, node: RuntimeNode, old: str, new: str) -> None:
        self._prods.pop(node.index, None)
        for k, t in enumerate(node.inputs):
            if t == old:
                node.inputs[k] = new
                lst = self.consumers.get(old)
                if lst and node.index in lst:
                    lst.remove(node.index)
                self.consumers.setdefault(new, []).append(node.index)

    def rewire(self, old: str, new: str) -> None:
        """Every reader of tensor ``old`` reads ``new`` instead."""
        for i in list(dict.fromkeys(self.consumers.get(old, ()))):
            node = self.nodes[i]
            if node is not None:
                self.replace_input(node, old, new)

    # -- orders ---------------------------------------------------------------------------

    def default_order(self) -> list[int]:
        """onnxruntime's DEFAULT execution order of the current graph (node indices)."""
        producers: dict[int, list[int]] = {}
        has_consumer: set[int] = set()
        indices: list[int] = []
        follow: dict[int, int] = {}
        for n in self.nodes:
            if n is None:
                continue
            indices.append(n.index)
            ps = self.producers_of(n)
            if ps:
                producers[n.index] = ps
                has_consumer.update(ps)
                if n.key in (("", "Shape"), ("", "Size")):
                    follow[n.index] = ps[0]
        return default_order(indices, producers, has_consumer, follow)

    def priority_order(self) -> list[int]:
        live = self.live()
        producers = {n.index: self.producers_of(n) for n in live}
        return priority_order([n.index for n in live], producers, {n.index: n.op for n in live})


# -- building -----------------------------------------------------------------------------


def _attrs(proto: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in proto.attribute}


def runtime_graph(model: onnx.ModelProto, sizes: TensorSizes, *, max_constant_elements: int = 64) -> RuntimeGraph:
    """The model as onnxruntime loads it (``Constant`` nodes turned into initializers), unoptimized."""
    g = model.graph
    inputs = [v.name for v in g.input]
    input_set = set(inputs)
    inits: dict[str, onnx.TensorProto] = {}
    for t in g.initializer:
        if int(np.prod(t.dims, dtype=np.int64)) <= max_constant_elements and not t.external_data:
            inits[t.name] = t
        else:
            stub = onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims)
            inits[t.name] = stub
    nodes: list[RuntimeNode | None] = []
    for proto in g.node:
        domain = "" if proto.domain in ("", "ai.onnx") else proto.domain
        if proto.op_type == "Constant" and domain == "" and len(proto.output) == 1:
            value = next((a.t for a in proto.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None)
            if value is not None:
                t = onnx.TensorProto()
                t.CopyFrom(value)
                t.name = proto.output[0]
                inits[t.name] = t
                continue
        nodes.append(
            RuntimeNode(len(nodes), proto.name, proto.op_type, domain, list(proto.input), list(proto.output),
                        _attrs(proto), (proto.name,))
        )
    rg = RuntimeGraph(
        nodes=nodes,
        graph_inputs=inputs,
        graph_outputs=[v.name for v in g.output],
        initializers=inits,
        constants={n for n in inits if n not in input_set},
        sizes=sizes,
    )
    rg.reindex()
    return rg


def optimize(rg: RuntimeGraph, *, max_steps: int = 10) -> RuntimeGraph:
    """Apply the emulated level-1 and level-2 rewrites to ``rg`` in place; returns it."""
    # A pass whose op types do not occur in the graph is skipped (it would change nothing);
    # each pass that runs walks the graph's current DEFAULT order, as onnxruntime's do.
    transpose, matmuls = ("", "Transpose"), (("", "MatMul"), (MS, "FusedMatMul"))
    for _ in range(max_steps):
        changed = _level1_rules(rg)
        changed |= _constant_sharing(rg)
        changed |= _cse(rg)
        changed |= _constant_folding(rg)
        if rg.has_op(transpose):
            changed |= _merge_transposes(rg)
        if not changed:
            break
    for _ in range(max_steps):
        changed = rg.has_op(("", "Gemm")) and _level2_rules(rg)
        if rg.has_op(transpose):
            changed |= _matmul_transpose_fusion(rg)
        if rg.has_op(*matmuls):
            changed |= _matmul_scale_fusion(rg)
        if not changed:
            break
    return rg


# -- level 1 ------------------------------------------------------------------------------


def _level1_rules(rg: RuntimeGraph) -> bool:
    changed = False
    for i in rg.default_order():
        node = rg.nodes[i]
        if node is None:
            continue
        if node.key == ("", "Identity"):
            changed |= _eliminate_identity(rg, node)
        elif node.key == ("", "Cast") and _cast_is_noop(rg, node):
            changed |= _eliminate_identity(rg, node, rule="CastElimination")
        elif node.key == ("", "Gemm"):
            changed |= _gemm_sum_fusion(rg, node) or _gemm_transpose_fusion(rg, node)
        elif node.key in _NOOP_IDENTITY:
            changed |= _noop_elimination(rg, node)
    return changed


def _level2_rules(rg: RuntimeGraph) -> bool:
    changed = False
    for i in rg.default_order():
        node = rg.nodes[i]
        if node is not None and node.key == ("", "Gemm"):
            changed |= _gemm_transpose_fusion(rg, node)
    return changed


_NOOP_IDENTITY = {("", "Add"): (0.0, (0, 1)), ("", "Sub"): (0.0, (1,)), ("", "Mul"): (1.0, (0, 1)), ("", "Div"): (1.0, (1,))}


def _noop_elimination(rg: RuntimeGraph, node: RuntimeNode) -> bool:
    """``NoopElimination``: Add/Sub of a constant 0, Mul/Div by a constant 1 (one element, no broadcast)."""
    if len(node.inputs) != 2 or rg.produces_graph_output(node):
        return False
    identity, sides = _NOOP_IDENTITY[node.key]
    for k in sides:
        c, other = node.inputs[k], node.inputs[1 - k]
        if not rg.is_constant(c):
            continue
        value = _constant_value(rg, c)
        if value is None or value.size != 1 or float(value.reshape(-1)[0]) != identity:
            continue
        other_rank = _rank(rg, other)
        if other_rank is None or value.ndim > other_rank:
            continue
        rg.rewire(node.outputs[0], other)
        rg.remove(node)
        rg.rewrites["NoopElimination"] += 1
        return True
    return False


def _merge_transposes(rg: RuntimeGraph) -> bool:
    """The part of ``TransposeOptimizer`` that meets training graphs most: a Transpose of a Transpose
    becomes one Transpose of the original tensor (or nothing, when the permutations cancel); the
    first Transpose goes once nothing reads it."""
    changed = False
    for i in rg.default_order():
        node = rg.nodes[i]
        if node is None or node.key != ("", "Transpose"):
            continue
        first = rg.node_of(node.inputs[0])
        if first is None or first.key != ("", "Transpose"):
            continue
        p1, p2 = first.attrs.get("perm"), node.attrs.get("perm")
        if p1 is None or p2 is None or len(p1) != len(p2):
            continue
        combined = [list(p1)[j] for j in p2]
        source = first.inputs[0]
        if combined == list(range(len(combined))):
            if rg.produces_graph_output(node):
                continue
            rg.rewire(node.outputs[0], source)
            rg.remove(node)
        else:
            rg.replace_input(node, node.inputs[0], source)
            node.attrs["perm"] = combined
            node.origin = node.origin + first.origin
        if not rg.consumers.get(first.outputs[0]) and not rg.produces_graph_output(first):
            rg.remove(first)
        rg.rewrites["TransposeOptimizer (transpose pairs)"] += 1
        changed = True
    return changed


def _cast_is_noop(rg: RuntimeGraph, node: RuntimeNode) -> bool:
    src = node.inputs[0] if node.inputs else ""
    return bool(src) and rg.sizes.elem_type(src) == node.attrs.get("to")


def _eliminate_identity(rg: RuntimeGraph, node: RuntimeNode, rule: str = "EliminateIdentity") -> bool:
    """``EliminateIdentity``: readers of the output read the input; or, when the output is a graph
    output read by no node, the producer writes the graph output directly."""
    if len([t for t in node.inputs if t]) != 1 or len([o for o in node.outputs if o]) != 1:
        return False
    src, out = node.inputs[0], node.outputs[0]
    if not rg.produces_graph_output(node):
        rg.rewire(out, src)
        rg.remove(node)
        rg.rewrites[rule] += 1
        return True
    # Identity -> graph output: only when nothing else reads the output and the producer's
    # tensor feeds this Identity alone and is no graph output itself.
    if rg.consumers.get(out):
        return False
    prod = rg.node_of(src)
    if prod is None or src in rg.graph_output_set or len(rg.consumers.get(src, ())) != 1:
        return False
    rg.remove(node)
    k = prod.outputs.index(src)
    prod.outputs[k] = out
    rg._touch_readers([src, out])
    rg.producer.pop(src, None)
    rg.producer[out] = prod.index
    rg.rewrites[rule] += 1
    return True


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
        if all(rg.nodes[r] is not None and rg.nodes[r].key == ("", "Gemm") for r in readers):
            return t
        return None

    a_t, b_t = fusable_input(0), fusable_input(1)
    out_t = None
    if len([t for t in gemm.inputs if t]) <= 2 and not rg.produces_graph_output(gemm):
        readers = rg.consumers.get(gemm.outputs[0], ())
        if len(readers) == 1:
            cand = rg.nodes[readers[0]]
            if (cand is not None and cand.key == ("", "Transpose") and len(rg.producers_of(cand)) == 1
                    and _is_matrix_transpose(rg, cand)):
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


# ConstantSharing's limits in onnxruntime 1.19 (measured: two Reshapes of one tensor by equal
# shape initializers of 8 int64 elements become one node after CSE, of 9 stay two; a 2x2
# initializer is not shared, nor a scalar with a one-element vector).
_SHARED_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                           onnx.TensorProto.INT32, onnx.TensorProto.INT64})
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
        value = _constant_value(rg, name)
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
    attrs = {"transA": int(gemm.attrs.get("transA", 0)), "transB": int(gemm.attrs.get("transB", 0)),
             "alpha": float(gemm.attrs.get("alpha", 1.0)), "beta": 1.0}
    rg.remove(gemm)
    rg.remove(total)
    rg.add(gemm.name + "/GemmSumFusion/", "Gemm", "", [gemm.inputs[0], gemm.inputs[1], other], list(total.outputs),
           attrs, gemm.origin + total.origin)
    rg.rewrites["GemmSumFusion"] += 1
    return True


def _cse(rg: RuntimeGraph) -> bool:
    """``CommonSubexpressionElimination``: a deterministic node equal to an earlier one (op,
    attributes, inputs) is dropped and its readers read the earlier node's outputs."""
    seen: dict[tuple, RuntimeNode] = {}
    changed = False
    for i in rg.default_order():
        node = rg.nodes[i]
        if node is None or node.op in RANDOM_OPS or rg.produces_graph_output(node):
            continue
        try:
            key = (node.domain, node.op, tuple(node.inputs), len(node.outputs), _attr_key(node.attrs))
        except TypeError:
            continue
        first = seen.get(key)
        if first is None:
            seen[key] = node
            continue
        for mine, theirs in zip(node.outputs, first.outputs):
            if mine and theirs:
                rg.rewire(mine, theirs)
            elif mine:
                break
        else:
            rg.remove(node)
            rg.rewrites["CommonSubexpressionElimination"] += 1
            changed = True
    return changed


def _attr_key(attrs: dict) -> tuple:
    out = []
    for k in sorted(attrs):
        v = attrs[k]
        if isinstance(v, (list, tuple)):
            v = tuple(x.SerializeToString() if hasattr(x, "SerializeToString") else x for x in v)
        elif hasattr(v, "SerializeToString"):
            v = v.SerializeToString()
        out.append((k, v))
    return tuple(out)


def _constant_folding(rg: RuntimeGraph) -> bool:
    """``ConstantFolding``: nodes whose inputs are all constant become initializers; so does the
    ``Shape`` of a tensor whose shape is fully static."""
    changed = False
    for i in rg.default_order():
        node = rg.nodes[i]
        if node is None or node.op in RANDOM_OPS or rg.produces_graph_output(node):
            continue
        if node.key == ("", "Shape"):
            src = node.inputs[0]
            dims = rg.sizes.raw_dims(src) if rg.sizes.declared(src) else None
            if dims is None or any(not isinstance(d, int) or d <= 0 for d in dims):
                continue
            start, end = node.attrs.get("start", 0), node.attrs.get("end", None)
            value = np.array(list(dims)[slice(start, end)], dtype=np.int64)
            _fold(rg, node, [value])
            changed = True
            continue
        ins = [t for t in node.inputs if t]
        if not ins or not all(rg.is_constant(t) for t in ins) or node.domain not in ("", MS):
            continue
        values = _evaluate(rg, node)
        _fold(rg, node, values)
        changed = True
    return changed


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


def _constant_value(rg: RuntimeGraph, name: str) -> np.ndarray | None:
    if name in rg._values:
        return rg._values[name]
    value = _read_constant(rg, name)
    rg._values[name] = value
    return value


def _read_constant(rg: RuntimeGraph, name: str) -> np.ndarray | None:
    t = rg.initializers.get(name)
    if t is None:
        return None
    if not (t.raw_data or t.float_data or t.int64_data or t.int32_data or t.double_data) and int(np.prod(t.dims)) != 0:
        return None
    try:
        return numpy_helper.to_array(t)
    except Exception:
        return None


def _evaluate(rg: RuntimeGraph, node: RuntimeNode) -> list[np.ndarray | None]:
    """Values of a folded node's outputs where cheap to compute (small scalar arithmetic), else None."""
    vals = [_constant_value(rg, t) for t in node.inputs if t]
    if any(v is None for v in vals):
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


# -- level 2 ------------------------------------------------------------------------------


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


def _rank(rg: RuntimeGraph, tensor: str) -> int | None:
    dims = rg.sizes.raw_dims(tensor) if rg.sizes.declared(tensor) else None
    return None if dims is None else len(dims)


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
        if node is None:
            continue
        is_fused = node.key == (MS, "FusedMatMul")
        if not (node.key == ("", "MatMul") or is_fused) or len(node.inputs) < 2:
            continue
        if any(rg.sizes.elem_type(t) not in _FLOAT_TYPES + (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
               for t in node.inputs[:2]):
            continue
        left = None if (is_fused and node.attrs.get("transBatchA", 0)) else _transpose_for_matmul(rg, node.inputs[0])
        right = None if (is_fused and node.attrs.get("transBatchB", 0)) else _transpose_for_matmul(rg, node.inputs[1])
        if (left and left[2]) or (right and right[2]):
            ra, rb = _rank(rg, node.inputs[0]), _rank(rg, node.inputs[1])
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
        other_rank = _rank(rg, other) or 0
        if len(dims) > other_rank:
            continue
        value = _constant_value(rg, c)
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
        if node is None or not (node.key == ("", "MatMul") or node.key == (MS, "FusedMatMul")):
            continue
        if any(rg.sizes.elem_type(t) not in _FLOAT_TYPES for t in node.inputs[:2]):
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
            if s is not None and r.inputs[1 - s[1]] == out:
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


def execution_order(model: onnx.ModelProto, sizes: TensorSizes) -> list[str]:
    """Names of ``model``'s nodes in the order onnxruntime's DEFAULT order would run them (emulated).

    A node fused into another is listed where the fused node runs; nodes removed without a
    replacement are left out. ``sizes`` is not changed.
    """
    from .contrib_shapes import infer_runtime_shapes

    runtime_sizes = sizes.copy()
    infer_runtime_shapes(model, runtime_sizes)
    rg = optimize(runtime_graph(model, runtime_sizes))
    return [name for i in rg.default_order() for name in rg.nodes[i].origin]  # type: ignore[union-attr]
