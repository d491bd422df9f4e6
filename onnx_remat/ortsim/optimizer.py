"""What onnxruntime 1.19 does to a training graph before it plans memory, emulated.

Input: an ``onnx.ModelProto`` (a training graph) and its tensor shapes
(:class:`~onnx_remat.analysis.sizes.TensorSizes`). Output: a :class:`RuntimeGraph`: the nodes onnxruntime
would execute, each with the *node index* onnxruntime gives it, which is what its execution
order depends on (:mod:`onnx_remat.ortsim.order`).

An ``InferenceSession`` (and the training ``Module``) with the default ``ORT_ENABLE_ALL`` level
rewrites the graph on CPU before planning. These rewrites change which tensors exist and the order
the rest runs in, so an estimate that ignored them is off by up to 17% on the example models
(measured: the MindSpore 10-Block network is planned at 215.0 MiB; its unoptimized graph would
need 251.5). Emulated here, in onnxruntime's order, each pass walking the graph in its current
DEFAULT execution order:

* at load: ``Constant`` nodes become initializers;
* level 1, repeated until nothing changes: ``EliminateIdentity``, ``CastElimination``,
  ``NoopElimination``, ``GemmSumFusion`` and ``GemmTransposeFusion`` (rules), ``ConstantSharing``
  (equal constant initializers of up to 8 elements become one), ``CommonSubexpressionElimination``,
  ``ConstantFolding`` (nodes whose inputs are all constant, and ``Shape`` of a statically shaped
  tensor, with the chain of nodes that fed only that Shape), and the ``TransposeOptimizer`` (Transposes pushed through element-wise, Softmax,
  Concat/Split, Reduce and (Un)Squeeze ops where that removes transposed dimensions, cancelling
  or merging with other Transposes; see :class:`_TransposeOptimizer`);
* level 2, repeated until nothing changes: ``GemmTransposeFusion``, ``MatmulTransposeFusion``
  (a Transpose of the last two axes, or of the batch axis, folded into ``FusedMatMul``),
  ``MatMulScaleFusion`` (Mul/Div by a scalar constant before or after a MatMul folded into
  ``FusedMatMul``'s alpha).

New nodes are appended (the next free index) and removed nodes leave holes, as in onnxruntime.
Not emulated (do not change the example graphs; see README for what that means elsewhere):
the TransposeOptimizer's handlers of Shape, Reshape, Slice, Tile, Pad, ArgMax/ArgMin, Resize,
MaxPool and Q/DQ (they count in its cost, nothing is pushed through them), the
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

from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.graph.conventions import MS_DOMAIN as MS
from onnx_remat.ortsim.order import default_order, priority_order

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
    opset: int = 0  # the model's default-domain opset
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
            value = next(
                (a.t for a in proto.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None
            )
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
        opset=next((op.version for op in model.opset_import if op.domain in ("", "ai.onnx")), 0),
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
            changed |= _transpose_optimizer(rg)
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


_NOOP_IDENTITY = {
    ("", "Add"): (0.0, (0, 1)),
    ("", "Sub"): (0.0, (1,)),
    ("", "Mul"): (1.0, (0, 1)),
    ("", "Div"): (1.0, (1,)),
}


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


# -- TransposeOptimizer ----------------------------------------------------------------------
#
# onnxruntime's level-1 TransposeOptimizer (core/optimizer/transpose_optimization/
# onnx_transpose_optimization.cc, OptimizeImpl), emulated for the ONNX ops training graphs meet.
# It walks the nodes once in DEFAULT order; at each node reading a Transpose it estimates the
# cost of pushing that Transpose through the node (transposed dimensions before minus after,
# "rank" = number of dimensions != 1, 5 when unknown; an output leading through supported ops to
# another Transpose costs nothing) and pushes it when the cost strictly falls: the node's inputs
# get the inverse permutation (cancelling Transposes, composing them, transposing constants in
# place, or adding new Transpose / Unsqueeze nodes) and its outputs a new Transpose each. New
# nodes are appended (the next free index), as onnxruntime's AddNode does. Handled: element-wise
# unary and broadcasting ops, Transpose, Softmax / LogSoftmax / Hardmax, Concat, Split, the Reduce
# ops, Squeeze, Unsqueeze; the other ops onnxruntime has a handler for (Shape, Reshape, Slice,
# Tile, Pad, ArgMax / ArgMin, Resize, MaxPool, Q/DQ) count as handled in the cost but are never
# pushed through (a simplification: they rarely follow a Transpose in training graphs).
# Contrib and gradient ops (com.microsoft) have no handler: Transposes stop there.

_TP_SIMPLE = frozenset({
    "Cast", "Exp", "Gelu", "Identity", "LeakyRelu", "Log", "Reciprocal", "Relu", "Sigmoid", "Sqrt", "Tanh",
    "Abs", "Not", "Ceil", "Floor", "Neg", "Erf", "HardSigmoid", "Round", "IsInf", "IsNaN", "Selu", "Shrink",
    "Sign", "Softplus", "Softsign", "ThresholdedRelu", "Celu", "HardSwish", "Sin", "Cos", "Tan", "Sinh", "Cosh",
    "Asin", "Acos", "Atan", "Asinh", "Acosh", "Atanh"})
_TP_BROADCAST = frozenset({
    "Add", "Max", "Min", "Mul", "Sub", "Div", "And", "Or", "Xor", "Mod", "PRelu", "BitShift", "Equal", "Greater",
    "Less", "GreaterOrEqual", "LessOrEqual", "Mean", "Sum", "Pow", "Where"})
_TP_REDUCE = frozenset({"ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd",
                        "ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceL2"})
_TP_KIND = {op: "simple" for op in _TP_SIMPLE}
_TP_KIND.update({op: "broadcast" for op in _TP_BROADCAST})
_TP_KIND.update({op: "reduce" for op in _TP_REDUCE})
_TP_KIND.update({"Clip": "first", "CastLike": "first", "Transpose": "transpose", "Concat": "concat",
                 "Split": "split", "Softmax": "softmax", "Hardmax": "softmax", "LogSoftmax": "softmax",
                 "Squeeze": "squeeze", "Unsqueeze": "unsqueeze"})
# onnxruntime has handlers for these too; the emulation never pushes through them. Shape's and
# Reshape's handlers do not transpose outputs, the others do.
_TP_KIND.update({op: "inert" for op in ("Pad", "Slice", "Tile", "ArgMin", "ArgMax", "Resize", "MaxPool",
                                        "QuantizeLinear", "DequantizeLinear")})
_TP_KIND.update({"Shape": "inert_no_output", "Reshape": "inert_no_output"})
_TP_NO_OUTPUT_TRANSPOSE = frozenset({"transpose", "inert_no_output"})
_TP_INERT = frozenset({"inert", "inert_no_output"})


def _invert_perm(perm: list[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def _compose_perm(perm1: list[int], perm2: list[int]) -> list[int]:
    return [perm1[p] for p in perm2]


def _valid_perm(perm) -> list[int] | None:
    if perm is None:
        return None
    perm = [int(p) for p in perm]
    return perm if sorted(perm) == list(range(len(perm))) else None


def _unsqueeze_perm(axes: list[int], perm: list[int]) -> list[int]:
    new_rank = len(perm) + len(axes)
    added = [False] * new_rank
    for a in axes:
        added[a] = True
    axes_map = [i for i in range(new_rank) if not added[i]]
    out, j = [], 0
    for i in range(new_rank):
        if added[i]:
            out.append(i)
        else:
            out.append(axes_map[perm[j]])
            j += 1
    return out


def _squeeze_perm(axes: list[int], perm: list[int]) -> list[int]:
    removed = [False] * len(perm)
    for a in axes:
        removed[a] = True
    axes_map, j = [0] * len(perm), 0
    for i in range(len(perm)):
        if not removed[i]:
            axes_map[i] = j
            j += 1
    return [axes_map[p] for p in perm if not removed[p]]


def _normalize_axes(axes: list[int], rank: int) -> list[int] | None:
    out = [a + rank if a < 0 else a for a in axes]
    if any(a < 0 or a >= rank for a in out) or len(set(out)) != len(out):
        return None
    return out


class _TransposeOptimizer:
    def __init__(self, rg: RuntimeGraph, opset: int) -> None:
        self.rg = rg
        self.opset = opset
        self.token = 0
        self.changed = False

    # -- graph queries ------------------------------------------------------------------------

    def kind(self, node: RuntimeNode) -> str | None:
        return _TP_KIND.get(node.op) if node.domain == "" else None

    def shape(self, t: str) -> tuple | None:
        sizes = self.rg.sizes
        if not t:
            return None
        if sizes.declared(t):
            return sizes.raw_dims(t)
        init = self.rg.initializers.get(t)
        return tuple(init.dims) if init is not None else None

    def rank_cost(self, t: str) -> int:
        dims = self.shape(t)
        return 5 if dims is None else sum(1 for d in dims if d != 1)

    def set_shape(self, name: str, like: str, dims) -> None:
        elem = self.rg.sizes.elem_type(like) or onnx.TensorProto.FLOAT
        vi = helper.make_tensor_value_info(name, elem, [d if isinstance(d, (int, str)) else None for d in dims])
        self.rg.sizes._add_value_infos([vi], overwrite=True)

    def is_constant(self, t: str) -> bool:
        return bool(t) and self.rg.node_of(t) is None and self.rg.is_constant(t)

    def readers(self, t: str) -> list[RuntimeNode]:
        return [self.rg.nodes[i] for i in self.rg.consumer_nodes(t) if self.rg.nodes[i] is not None]

    def comprehensive(self, t: str) -> bool:
        return t not in self.rg.graph_output_set

    def transposible(self, node: RuntimeNode, kind: str) -> list[int]:
        if kind in ("simple", "concat"):
            return list(range(len(node.inputs)))
        if kind == "broadcast":
            return [i for i, t in enumerate(node.inputs) if self.shape(t) is None or len(self.shape(t)) != 0]
        return [0]

    def new_name(self, base: str) -> str:
        self.token += 1
        return f"TransposeOptimizer/{base}_token_{self.token}"

    # -- edits --------------------------------------------------------------------------------

    def make_transpose(self, inp: str, perm: list[int]) -> RuntimeNode:
        name = self.new_name("Transpose")
        return self.rg.add(name, "Transpose", "", [inp], [name + "_out0"], {"perm": list(perm)}, ())

    def add_int64_initializer(self, values: list[int]) -> str:
        name = self.new_name("const_transpose_optimizer")
        arr = np.array(values, dtype=np.int64)
        self.rg.initializers[name] = numpy_helper.from_array(arr, name)
        self.rg.constants.add(name)
        self.rg._values[name] = arr
        self.set_shape(name, name, arr.shape)
        self.rg.sizes._add_value_infos([helper.make_tensor_value_info(name, onnx.TensorProto.INT64, list(arr.shape))],
                                       overwrite=True)
        return name

    def set_input(self, node: RuntimeNode, k: int, new: str) -> None:
        old = node.inputs[k]
        if old == new:
            return
        rg = self.rg
        rg._prods.pop(node.index, None)
        node.inputs[k] = new
        lst = rg.consumers.get(old)
        if lst and node.index in lst:
            lst.remove(node.index)
        if new:
            rg.consumers.setdefault(new, []).append(node.index)

    def remove(self, node: RuntimeNode) -> None:
        if self.rg.nodes[node.index] is not None:
            self.rg.remove(node)

    def move_output(self, src: RuntimeNode, k: int, dst: RuntimeNode, j: int) -> None:
        """onnxruntime's MoveOutput: ``dst`` takes over output ``k`` of ``src`` (its name and readers);
        ``src`` gets a new output name."""
        rg = self.rg
        name = src.outputs[k]
        new = self.new_name(name.rsplit("/", 1)[-1] or "out")
        src.outputs[k] = new
        dst.outputs[j] = name
        rg._touch_readers([name])
        rg.producer[name] = dst.index
        rg.producer[new] = src.index

    def transpose_input(self, node: RuntimeNode, i: int, perm: list[int], perm_inv: list[int]) -> None:
        rg = self.rg
        inp = node.inputs[i]
        self.set_input(node, i, "")
        if self.is_constant(inp):
            # Case 1: a constant is transposed in place; its other readers get a Transpose back.
            self.set_input(node, i, inp)
            init = rg.initializers.get(inp)
            n_elem = int(np.prod(init.dims)) if init is not None else 0
            dims = self.shape(inp)
            if n_elem == 1 or dims is None or (len(dims) == 1 and dims[0] == len(perm)):
                return
            others = [r for r in self.readers(inp) if r.index != node.index]
            if others:
                t = self.make_transpose(inp, perm_inv)
                self.set_shape(t.outputs[0], inp, dims)
                for r in others:
                    for k, x in enumerate(r.inputs):
                        if x == inp:
                            self.set_input(r, k, t.outputs[0])
            if len(dims) == len(perm):
                self.set_shape(inp, inp, [dims[p] for p in perm])
            return
        producer = rg.node_of(inp)
        if producer is not None and producer.key == ("", "Transpose"):
            perm2 = _valid_perm(producer.attrs.get("perm"))
            if perm2 is not None and len(perm2) == len(perm):
                pre = producer.inputs[0]
                if perm2 == perm_inv:  # Case 2: they cancel
                    self.set_input(node, i, pre)
                    if not rg.consumers.get(inp) and self.comprehensive(inp):
                        self.remove(producer)
                    return
                t = self.make_transpose(pre, _compose_perm(perm2, perm))
                dims = self.shape(inp)
                if dims is not None:
                    self.set_shape(t.outputs[0], inp, [dims[p] for p in perm])
                if not rg.consumers.get(inp) and self.comprehensive(inp):
                    self.remove(producer)
                self.set_input(node, i, t.outputs[0])
                return
        for r in self.readers(inp):  # Case 3: the same Transpose exists already
            if r.key == ("", "Transpose") and _valid_perm(r.attrs.get("perm")) == perm:
                self.set_input(node, i, r.outputs[0])
                return
        t = self.make_transpose(inp, perm)  # Case 4: a new Transpose
        dims = self.shape(inp)
        if dims is not None and len(dims) == len(perm):
            self.set_shape(t.outputs[0], inp, [dims[p] for p in perm])
        self.set_input(node, i, t.outputs[0])

    def transpose_output(self, node: RuntimeNode, k: int, perm: list[int], perm_inv: list[int]) -> str:
        t = self.rg.add(self.new_name("Transpose"), "Transpose", "", [""], [""], {"perm": list(perm)}, ())
        old = node.outputs[k]
        dims = self.shape(old)
        self.move_output(node, k, t, 0)
        self.set_input(t, 0, node.outputs[k])
        if dims is not None and len(dims) == len(perm_inv):
            self.set_shape(node.outputs[k], old, [dims[p] for p in perm_inv])
        return old

    def transpose_outputs(self, node: RuntimeNode, perm: list[int]) -> None:
        if perm == list(range(len(perm))):
            return
        inv = _invert_perm(perm)
        for k, o in enumerate(node.outputs):
            if o:
                self.transpose_output(node, k, perm, inv)

    def unsqueeze_input(self, node: RuntimeNode, i: int, axes: list[int]) -> None:
        rg = self.rg
        inp = node.inputs[i]
        self.set_input(node, i, "")
        if self.is_constant(inp):  # Case 1: reshape the constant (its other readers get a Squeeze)
            others = [r for r in self.readers(inp) if r.index != node.index]
            dims = self.shape(inp)
            if others:
                sq = self.make_squeeze_or_unsqueeze("Squeeze", inp, axes)
                if dims is not None:
                    self.set_shape(sq.outputs[0], inp, dims)
                for r in others:
                    for k, x in enumerate(r.inputs):
                        if x == inp:
                            self.set_input(r, k, sq.outputs[0])
            if dims is not None:
                self.set_shape(inp, inp, _unsqueeze_shape(dims, axes))
            self.set_input(node, i, inp)
            return
        producer = rg.node_of(inp)
        if producer is not None and producer.key == ("", "Squeeze") and self.read_axes(producer) == axes:
            self.set_input(node, i, producer.inputs[0])  # Case 2: undo a Squeeze
            if not rg.consumers.get(inp) and self.comprehensive(inp):
                self.remove(producer)
            return
        un = self.make_squeeze_or_unsqueeze("Unsqueeze", inp, axes)  # Case 3
        if producer is not None and producer.key == ("", "Transpose"):
            perm = _valid_perm(producer.attrs.get("perm"))
            if perm is not None:
                self.transpose_input(un, 0, _invert_perm(perm), perm)
                new_perm = _unsqueeze_perm(axes, perm)
                self.set_input(node, i, self.transpose_output(un, 0, new_perm, _invert_perm(new_perm)))
                return
        self.set_input(node, i, un.outputs[0])

    def make_squeeze_or_unsqueeze(self, op: str, inp: str, axes: list[int]) -> RuntimeNode:
        name = self.new_name(op)
        attrs: dict = {}
        inputs = [inp]
        if self.opset < 13:
            attrs["axes"] = list(axes)
        else:
            inputs.append(self.add_int64_initializer(axes))
        node = self.rg.add(name, op, "", inputs, [name + "_out0"], attrs, ())
        dims = self.shape(inp)
        if dims is not None:
            self.set_shape(node.outputs[0], inp, _unsqueeze_shape(dims, axes) if op == "Unsqueeze"
                           else [d for k, d in enumerate(dims) if k not in set(axes)])
        return node

    def read_axes(self, node: RuntimeNode) -> list[int] | None:
        if self.opset < 13 or (node.op.startswith("Reduce") and node.op != "ReduceSum" and self.opset < 18):
            axes = node.attrs.get("axes")
            return None if axes is None else [int(a) for a in axes]
        if len(node.inputs) < 2 or not node.inputs[1]:
            return None
        value = _constant_value(self.rg, node.inputs[1]) if self.rg.is_constant(node.inputs[1]) else None
        return None if value is None else [int(a) for a in np.asarray(value).reshape(-1)]

    # -- handlers -----------------------------------------------------------------------------

    def handle(self, kind: str, node: RuntimeNode, transpose: RuntimeNode, perm: list[int], indices: list[int]) -> bool:
        inv = _invert_perm(perm)
        rank = len(perm)
        if kind == "transpose":
            node_perm = _valid_perm(node.attrs.get("perm"))
            if node_perm is None or len(node_perm) != rank:
                return False
            if node_perm == inv:
                return self.cancel_transposes(transpose, node)
            self.set_input(node, 0, transpose.inputs[0])
            node.attrs["perm"] = _compose_perm(perm, node_perm)
            node.origin = node.origin + transpose.origin
            if not self.rg.consumers.get(transpose.outputs[0]) and self.comprehensive(transpose.outputs[0]):
                self.remove(transpose)
            return True
        if kind in ("simple", "first", "broadcast"):
            if kind == "broadcast":
                ranks = []
                for i in indices:
                    dims = self.shape(node.inputs[i])
                    if dims is None or len(dims) > rank:
                        return False
                    ranks.append(len(dims))
                for i, r in zip(indices, ranks):
                    if r < rank:
                        self.unsqueeze_input(node, i, list(range(rank - r)))
            for i in indices:
                self.transpose_input(node, i, inv, perm)
            self.transpose_outputs(node, perm)
            return True
        if kind in ("softmax", "concat", "split"):
            if kind == "softmax" and self.opset < 13:
                axis = int(node.attrs.get("axis", 1))
                axis = axis + rank if axis < 0 else axis
                if not 0 <= axis < rank or any((i < axis) != (perm[i] < axis) for i in range(rank)):
                    return False
                self.transpose_input(node, 0, inv, perm)
                self.transpose_outputs(node, perm)
                return True
            default = {"softmax": -1, "split": 0, "concat": None}[kind]
            axis = node.attrs.get("axis", default)
            if axis is None:
                return False
            axis = int(axis) + rank if int(axis) < 0 else int(axis)
            if not 0 <= axis < rank:
                return False
            for i in indices:
                self.transpose_input(node, i, inv, perm)
            self.transpose_outputs(node, perm)
            node.attrs["axis"] = perm[axis]
            return True
        if kind == "reduce":
            return self.handle_reduce(node, perm, inv)
        if kind == "squeeze":
            axes = self.read_axes(node)
            axes = None if axes is None else _normalize_axes(axes, rank)
            if axes is None:
                return False
            new_axes = sorted(perm[a] for a in axes)
            self.set_axes(node, new_axes)
            self.transpose_input(node, 0, inv, perm)
            self.transpose_outputs(node, _squeeze_perm(new_axes, perm))
            return True
        if kind == "unsqueeze":
            axes = self.read_axes(node)
            axes = None if axes is None else _normalize_axes(axes, rank + len(axes))
            if axes is None:
                return False
            self.transpose_input(node, 0, inv, perm)
            new_perm = _unsqueeze_perm(axes, perm)
            self.transpose_output(node, 0, new_perm, _invert_perm(new_perm))
            return True
        return False

    def set_axes(self, node: RuntimeNode, axes: list[int]) -> None:
        if self.opset < 13 or (node.op.startswith("Reduce") and node.op != "ReduceSum" and self.opset < 18):
            node.attrs["axes"] = list(axes)
        else:
            self.set_input(node, 1, self.add_int64_initializer(axes))

    def handle_reduce(self, node: RuntimeNode, perm: list[int], inv: list[int]) -> bool:
        keepdims = int(node.attrs.get("keepdims", 1)) != 0
        if (node.op == "ReduceSum" and self.opset < 13) or (node.op != "ReduceSum" and self.opset < 18):
            axes = node.attrs.get("axes")  # axes as an attribute
            if axes is None:
                self.transpose_input(node, 0, inv, perm)
                self.transpose_outputs(node, perm if keepdims else [])
                return True
        else:  # axes as an input
            name = node.inputs[1] if len(node.inputs) > 1 else ""
            if name and not self.rg.is_constant(name):
                return False
            value = _constant_value(self.rg, name) if name else None
            if name and value is None:
                return False
            axes = None if value is None else [int(a) for a in np.asarray(value).reshape(-1)]
            if not axes:  # reduce over everything, or nothing
                noop = int(node.attrs.get("noop_with_empty_axes", 0)) != 0
                self.transpose_input(node, 0, inv, perm)
                if noop or keepdims:
                    self.transpose_outputs(node, perm)
                return True
        axes = _normalize_axes([int(a) for a in axes], len(perm))
        if axes is None:
            return False
        new_axes = sorted(perm[a] for a in axes)
        self.set_axes(node, new_axes)
        self.transpose_input(node, 0, inv, perm)
        self.transpose_outputs(node, perm if keepdims else _squeeze_perm(new_axes, perm))
        return True

    def cancel_transposes(self, first: RuntimeNode, second: RuntimeNode) -> bool:
        """The second Transpose undoes the first: its readers read the first's input. (When the
        second writes a graph output onnxruntime moves that output onto the first's producer;
        rare in training graphs, not emulated: nothing changes.)"""
        rg = self.rg
        src, out = first.inputs[0], second.outputs[0]
        if not self.comprehensive(out):
            return False
        rg.rewire(out, src)
        rg.remove(second)
        if not rg.consumers.get(first.outputs[0]) and self.comprehensive(first.outputs[0]):
            self.remove(first)
        return True

    # -- the pass -----------------------------------------------------------------------------

    def input_cost(self, node: RuntimeNode, perm: list[int], indices: list[int]) -> int:
        cost = 0
        for i in indices:
            t = node.inputs[i]
            if not t or self.is_constant(t):
                continue
            producer = self.rg.node_of(t)
            if producer is not None and producer.key == ("", "Transpose"):
                perm2 = _valid_perm(producer.attrs.get("perm"))
                if perm2 is not None:
                    cost += -self.rank_cost(t) if perm2 == perm and self.likely_removable(producer) else 0
                    continue
            cost += self.rank_cost(t)
        return cost

    def likely_removable(self, transpose: RuntimeNode) -> bool:
        out = transpose.outputs[0]
        return self.comprehensive(out) and all(self.kind(r) is not None for r in self.readers(out))

    def run(self) -> bool:
        rg = self.rg
        order = rg.default_order()
        leading: set[str] = set()
        for idx in reversed(order):
            node = rg.nodes[idx]
            if node.key == ("", "Transpose"):
                leading.add(node.inputs[0])
                continue
            kind = self.kind(node)
            if kind is None or kind in _TP_NO_OUTPUT_TRANSPOSE:
                continue
            if any(o in leading for o in node.outputs if o):
                leading.update(node.inputs[j] for j in self.transposible(node, kind) if node.inputs[j])
        for idx in order:
            node = rg.nodes[idx]
            if node is None:
                continue
            for j, inp in enumerate(list(node.inputs)):
                if not inp:
                    continue
                transpose = rg.node_of(inp)
                if transpose is None or transpose.key != ("", "Transpose"):
                    continue
                perm = _valid_perm(transpose.attrs.get("perm"))
                if perm is None:
                    continue
                if self.process(transpose, node, perm, j, leading):
                    self.changed = True
                    rg.rewrites["TransposeOptimizer"] += 1
                    break
        return self.changed

    def process(self, transpose: RuntimeNode, node: RuntimeNode, perm: list[int], j: int, leading: set[str]) -> bool:
        kind = self.kind(node)
        if kind is None or kind in _TP_INERT:
            return False
        indices = self.transposible(node, kind)
        if j not in indices:
            return False
        if kind != "transpose":
            cost = self.input_cost(node, perm, indices)
            if cost < 0 and kind not in _TP_NO_OUTPUT_TRANSPOSE:
                outs = [o for o in node.outputs if o]
                if not any(o in leading for o in outs):
                    cost += max((self.rank_cost(o) for o in outs), default=0)
            if cost >= 0:
                return False
        return self.handle(kind, node, transpose, perm, indices)


def _unsqueeze_shape(dims, axes: list[int]) -> list:
    new_rank = len(dims) + len(axes)
    out: list = [None] * new_rank
    for a in axes:
        out[a] = 1
    it = iter(dims)
    return [1 if out[i] == 1 else next(it) for i in range(new_rank)]


def _transpose_optimizer(rg: RuntimeGraph) -> bool:
    """``TransposeOptimizer`` (level 1): see the comment above :class:`_TransposeOptimizer`."""
    if not 7 <= rg.opset <= 21:
        return False
    return _TransposeOptimizer(rg, rg.opset).run()


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
    from onnx_remat.ortsim.shapes import infer_runtime_shapes

    runtime_sizes = sizes.copy()
    infer_runtime_shapes(model, runtime_sizes)
    rg = optimize(runtime_graph(model, runtime_sizes))
    return [name for i in rg.default_order() for name in rg.nodes[i].origin]  # type: ignore[union-attr]
