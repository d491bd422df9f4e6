"""Analysis pass: output shapes of onnxruntime's contrib and gradient ops, and of what follows them.

Input: an ``onnx.ModelProto`` and its :class:`~onnx_remat.analysis.sizes.TensorSizes`. Output: the
TensorSizes gains a value info for every node output whose shape this pass can infer
(:func:`infer_runtime_shapes` returns how many and which stayed unknown).

onnx's shape inference stops at ops it has no schema for (``com.microsoft::FusedMatMul``,
``SoftmaxGrad_13``, ``BatchNormInternal``'s saved statistics, ``DropoutGrad``, ``PassThrough``
...), and so misses every standard op downstream of them too. onnxruntime infers those with its
own schemas, and its allocation planner only plans tensors whose shapes it knows, so the memory
estimate needs the same knowledge. This pass walks the graph once in topological order: contrib
ops get the rules below (what onnxruntime's schemas infer), standard ops whose inputs are now known
go through onnx's per-node inference. Only shapes known this way count as known to onnxruntime
(:meth:`TensorSizes.declared`); the ``<tensor>_grad`` naming rule of TensorSizes is a fallback
for sizes onnxruntime learns only at run time.

:func:`rewrite_sizes` gives a recompute rewrite the sizes onnxruntime knows without inferring its
whole graph again: the original's, updated where the rewrite added tensors.

Linear in nodes + edges, no recursion.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import onnx
from onnx import TensorProto, helper

from onnx_remat.analysis.sizes import Dim, TensorSizes
from onnx_remat.graph.conventions import MS_DOMAIN as MS
from onnx_remat.graph.tags import original_name
from onnx_remat.graph.toposort import index_order
from onnx_remat.ortsim.graph import NodeIO, element_count, node_attrs, node_io

Shape = tuple[Dim, ...]
# A rule gets (input shapes, input element types, attributes) and returns per output
# (element type, shape) or None where it cannot tell.
Rule = Callable[[list[Shape | None], list[int | None], dict], list[tuple[int | None, Shape | None] | None]]

_BOOL = TensorProto.BOOL


def _same_as(i: int, n_out: int = 1) -> Rule:
    def rule(shapes, types, attrs):
        return [(types[i] if i < len(types) else None, shapes[i] if i < len(shapes) else None)] * n_out

    return rule


def _broadcast(a: Shape, b: Shape) -> Shape | None:
    out: list[Dim] = []
    for x, y in zip(reversed((1,) * (len(b) - len(a)) + tuple(a)), reversed((1,) * (len(a) - len(b)) + tuple(b))):
        if x == 1:
            out.append(y)
        elif y == 1 or x == y:
            out.append(x)
        else:
            return None
    return tuple(reversed(out))


def _fused_matmul(shapes, types, attrs):
    a, b = shapes[0], shapes[1]
    if a is None or b is None or len(a) < 1 or len(b) < 1:
        return [None]
    a, b = list(a), list(b)
    if attrs.get("transBatchA", 0) and len(a) >= 3:
        a = a[1:-1] + [a[0], a[-1]]
    if attrs.get("transBatchB", 0) and len(b) >= 3:
        b = b[1:-1] + [b[0], b[-1]]
    if len(a) >= 2 and attrs.get("transA", 0):
        a[-1], a[-2] = a[-2], a[-1]
    if len(b) >= 2 and attrs.get("transB", 0):
        b[-1], b[-2] = b[-2], b[-1]
    squeeze_a, squeeze_b = len(a) == 1, len(b) == 1
    if squeeze_a:
        a = [1] + a
    if squeeze_b:
        b = b + [1]
    batch = _broadcast(tuple(a[:-2]), tuple(b[:-2]))
    if batch is None:
        return [None]
    out = list(batch) + ([] if squeeze_a else [a[-2]]) + ([] if squeeze_b else [b[-1]])
    return [(types[0], tuple(out))]


def _batchnorm_internal(shapes, types, attrs):
    x, scale, mean = shapes[0], shapes[1], shapes[3] if len(shapes) > 3 else None
    stat = scale if scale is not None else mean
    return [
        (types[0], x),
        (types[3] if len(types) > 3 else types[0], mean or stat),
        (types[4] if len(types) > 4 else types[0], mean or stat),
        (types[1], stat),
        (types[1], stat),
    ]


def _accumulator_v2(shapes, types, attrs):
    return [(_BOOL, ()), (types[0], shapes[0])]


def _passthrough(shapes, types, attrs):
    return list(zip(types, shapes))


def _record_event(shapes, types, attrs):
    return list(zip(types[1:], shapes[1:]))


def _layernorm(shapes, types, attrs):
    x = shapes[0]
    if x is None:
        return [None]
    axis = attrs.get("axis", -1)
    axis = axis + len(x) if axis < 0 else axis
    stat = tuple(x[:axis]) + (1,) * (len(x) - axis)
    stat_type = attrs.get("stash_type", TensorProto.FLOAT)
    return [(types[0], x), (stat_type, stat), (stat_type, stat)]


def _layernorm_grad(shapes, types, attrs):
    # (dY, X, scale, mean, inv_std_dev) -> (dX, dScale, dBias); the Simplified variant has no dBias
    scale = shapes[2] if len(shapes) > 2 else None
    scale_type = types[2] if len(types) > 2 else None
    return [(types[0], shapes[0]), (scale_type, scale), (scale_type, scale)]


def _concat_training(shapes, types, attrs):
    # output 0: the inputs concatenated along ``axis``; output 1: each input's length there (int64)
    n = len(shapes)
    lengths = (TensorProto.INT64, (n,))
    if n == 0 or any(s is None for s in shapes) or len({len(s) for s in shapes}) != 1:
        return [None, lengths]
    rank = len(shapes[0])
    axis = int(attrs.get("axis", 0))
    axis = axis + rank if axis < 0 else axis
    along = [s[axis] for s in shapes]
    if not 0 <= axis < rank or any(not isinstance(d, int) for d in along):
        return [None, lengths]
    out = tuple(shapes[0][:axis]) + (sum(along),) + tuple(shapes[0][axis + 1 :])
    return [(types[0], out), lengths]


def _bias_dropout(shapes, types, attrs):
    return [(types[0], shapes[0]), (_BOOL, shapes[0])]


def _sce_internal(shapes, types, attrs):
    logits = shapes[0]
    reduction = attrs.get("reduction", b"mean")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    loss = (logits[0],) + tuple(logits[2:]) if (logits is not None and reduction == "none") else ()
    return [(types[0], loss if logits is not None else None), (types[0], logits)]


RULES: dict[str, Rule] = {
    "FusedMatMul": _fused_matmul,
    "TransposeScaleMatMul": _fused_matmul,
    "BatchNormInternal": _batchnorm_internal,
    "InPlaceAccumulatorV2": _accumulator_v2,
    "InPlaceAccumulator": _same_as(0),
    "ZeroGradient": _same_as(0),
    "PassThrough": _passthrough,
    "RecordEvent": _record_event,
    "WaitEvent": _record_event,
    "LayerNormalization": _layernorm,
    "LayerNormalizationGrad": _layernorm_grad,
    "ConcatTraining": _concat_training,
    "SimplifiedLayerNormalizationGrad": _layernorm_grad,
    "SimplifiedLayerNormalization": _layernorm,
    "BiasDropout": _bias_dropout,
    "BitmaskDropout": _bias_dropout,
    "SoftmaxCrossEntropyLossInternal": _sce_internal,
    "SoftmaxCrossEntropyLossGrad": _same_as(1),
    "SoftmaxCrossEntropyLossInternalGrad": _same_as(1),
    "SoftmaxCrossEntropyGrad": _same_as(1),
    "SparseSoftmaxCrossEntropyGrad": _same_as(1),
}
# Element-wise ops and gradients whose output 0 has the shape of input 0 (dY or X).
for _op in (
    "Gelu",
    "FastGelu",
    "BiasGelu",
    "QuickGelu",
    "BiasSoftmax",
    "DropoutGrad",
    "BiasDropoutGrad",
    "ReluGrad",
    "SigmoidGrad",
    "TanhGrad",
    "QuickGeluGrad",
    "GeluGrad",
    "FastGeluGrad",
    "BiasGeluGrad_dX",
    "BiasFastGeluGrad_dX",
    "SoftmaxGrad",
    "SoftmaxGrad_13",
    "LogSoftmaxGrad",
    "LogSoftmaxGrad_13",
    "LeakyReluGrad",
    "SinGrad",
    "ReciprocalGrad",
    "SqrtGrad",
    "BitmaskDropoutGrad",
    "Scale",
):
    RULES.setdefault(_op, _same_as(0))


@dataclass
class RuntimeShapeReport:
    """What :func:`infer_runtime_shapes` added."""

    added: int = 0
    by_rule: int = 0
    by_onnx: int = 0
    unknown: list[str] = field(default_factory=list)  # node outputs whose shape stays unknown


def _type_proto(elem_type: int, dims: Sequence[Dim]) -> onnx.TypeProto:
    return helper.make_tensor_type_proto(elem_type, [d if isinstance(d, (int, str)) else None for d in dims])


def infer_runtime_shapes(
    model: onnx.ModelProto, sizes: TensorSizes, *, max_constant_elements: int = 1024, io: NodeIO | None = None
) -> RuntimeShapeReport:
    """Infer the shapes onnxruntime would know and add them to ``sizes`` (see the module docstring).

    ``io``: :func:`~onnx_remat.ortsim.graph.node_io` of ``model``, if read already (not changed)."""
    nodes = list(model.graph.node)
    inference = _NodeInference(model, sizes, lambda: _small_constants(model.graph, nodes, max_constant_elements))
    report = inference.report
    declared = sizes.declared
    # Names read once (each read of a proto's repeated field makes new strings); no empty output.
    inputs, all_outputs = io if io is not None else node_io(model)
    outputs = [outs if "" not in outs else [o for o in outs if o] for outs in all_outputs]
    for i in _pending_order(inputs, outputs, declared):
        node, outs = nodes[i], outputs[i]
        inference.infer(node)
        for o in outs:
            if not sizes.declared(o):
                report.unknown.append(o)
    return report


def _pending_order(
    inputs: Sequence[Sequence[str]], outputs: Sequence[Sequence[str]], declared: Callable[[str], bool]
) -> list[int]:
    """Positions of the nodes with an output whose shape is not declared yet, in a stable topological
    order of those nodes alone (:func:`~onnx_remat.graph.toposort.index_order`).

    A node whose outputs are all declared is never inferred, and nothing but a node's own inference
    declares its outputs, so the nodes inferred are these, whatever the order. Each one's inference
    reads its inputs' sizes: those of a node left out are declared from the start, those of another
    pending node are inferred first in this order. So the sizes come out as a walk of the whole graph
    in its topological order gives them, without that walk: a recompute rewrite's sizes copied from
    the original's (:func:`rewrite_sizes`) leave 15,000 of 115,000 nodes pending at 10^5 nodes."""
    # (map: no generator frame per node)
    pending = [i for i, outs in enumerate(outputs) if outs and not all(map(declared, outs))]
    order = index_order([inputs[i] for i in pending], [outputs[i] for i in pending])
    return [pending[k] for k in order]


def rewrite_sizes(original: TensorSizes, model: onnx.ModelProto, *, io: NodeIO | None = None) -> TensorSizes:
    """The sizes onnxruntime knows for ``model``, a recompute rewrite (:mod:`onnx_remat.remat.rewrite`,
    then the order stage's edits) of the graph whose runtime sizes are ``original`` (an
    :class:`~onnx_remat.ortsim.emulation.Emulation`'s ``sizes``: the analysis's plus
    :func:`infer_runtime_shapes`); ``original`` is not changed.

    The same as ``TensorSizes(model)`` followed by :func:`infer_runtime_shapes`, without inferring
    the whole rewritten graph again (at 10^5 nodes, 3 s of each pipeline run): the original's
    tensors keep their sizes (the rewrite leaves their producers and inputs' shapes as they were),
    a clone's output (:func:`~onnx_remat.graph.tags.clone_tensor_name`) takes the shape of the
    tensor it recomputes (the same op and attributes on inputs of the same shapes), the rewrite's
    declarations are added, and :func:`infer_runtime_shapes` infers what is still unknown (gates,
    packed masks, pins, ...). tests/ortsim/test_rewrite_sizes.py compares the two ways on
    rewrites of the example and synthetic graphs; on 75 rewrites measured (the 18 corpus, 5 example
    and 2 synthetic graphs, each per layer, merged and with byte masks) every tensor's shape and
    known-ness matched.
    """
    if io is None:
        io = node_io(model)
    copies: dict[str, str] = {}
    for outs in io[1]:
        for o in outs:
            if o and o not in original:
                source = original_name(o)
                if source != o:
                    copies[o] = source
    sizes = original.extended_to(model.graph, copies)
    infer_runtime_shapes(model, sizes, io=io)
    return sizes


def _small_constants(graph: onnx.GraphProto, nodes: list[onnx.NodeProto], max_elements: int) -> dict[str, TensorProto]:
    """The values onnx's inference may read (a Reshape's shape, ...): initializers of at most
    ``max_elements`` elements, then the value of every ``Constant`` node (named by its output)."""
    constants: dict[str, TensorProto] = {}
    for init in graph.initializer:
        if element_count(init.dims) <= max_elements:
            constants[init.name] = init
    for n in nodes:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.output:
            for a in n.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    t = TensorProto()
                    t.CopyFrom(a.t)
                    t.name = n.output[0]
                    constants[t.name] = t
    return constants


def _value_key(tensor: TensorProto) -> bytes:
    """A constant's value as onnx's inference reads it: the TensorProto without its name."""
    if not tensor.name:
        return tensor.SerializeToString()
    unnamed = TensorProto()
    unnamed.CopyFrom(tensor)
    unnamed.ClearField("name")
    return unnamed.SerializeToString()


class _NodeInference:
    """The output shapes of one node at a time, added to ``sizes`` as they are inferred: by a rule
    of :data:`RULES` (onnxruntime's own schemas) or by onnx's inference of the node alone."""

    def __init__(
        self, model: onnx.ModelProto, sizes: TensorSizes, constants: Callable[[], dict[str, TensorProto]]
    ) -> None:
        opsets = {op.domain or "": op.version for op in model.opset_import}
        self.default_opset = opsets.get("", opsets.get("ai.onnx", 17))
        self.sizes = sizes
        self._read_constants = constants  # read when onnx's inference first needs them: most graphs never do
        self._constants: dict[str, TensorProto] | None = None
        self.report = RuntimeShapeReport()
        self.schema_cache: dict[tuple[str, str], onnx.defs.OpSchema | None] = {}
        # The answers (a rule's or onnx's) per node signature (op, attributes, input types and
        # shapes, and for onnx the inputs' constant values): a deep model repeats each layer's
        # nodes, and a recompute rewrite adds the same few nodes per segment (a mask's packing and
        # unpacking: 7,700 nodes, 8 distinct, at 10^5 nodes). The signature is made of the types as
        # read here, not of the TypeProtos onnx is given, which are made only for a new signature.
        self._inferred: dict[tuple, list] = {}
        self._value_keys: dict[str, bytes] = {}  # a constant input's value, as the signature holds it

    @property
    def constants(self) -> dict[str, TensorProto]:
        """The values onnx's inference may read (see :func:`_small_constants`), read once."""
        if self._constants is None:
            self._constants = self._read_constants()
        return self._constants

    def known(self, name: str) -> tuple[int | None, Shape | None]:
        """The element type and, where onnxruntime would know it, the shape of tensor ``name``."""
        sizes = self.sizes
        if not name or not sizes.declared(name):
            return (sizes.elem_type(name) if name else None), None
        return sizes.elem_type(name), sizes.raw_dims(name)

    def add(self, name: str, elem_type: int | None, dims: Shape | None) -> bool:
        """Declare ``name``'s type and shape in ``sizes``; False where either is missing."""
        if not name or dims is None or not elem_type:
            return False
        self.sizes.declare(name, elem_type, dims)
        self.report.added += 1
        return True

    def _signature(self, node: onnx.NodeProto, known: list[tuple[int | None, Shape | None]], values: bool) -> tuple:
        """What an inference of ``node`` reads: op, attributes, its inputs' types and shapes as
        ``known``, and with ``values`` the value of each input onnx's inference may read; names
        only pair inputs with these."""
        constants = self.constants if values else None
        inputs: list[object] = []
        for t, k in zip(node.input, known):
            if not t:
                inputs.append(None)
            elif constants is not None and t in constants:
                key = self._value_keys.get(t)
                if key is None:
                    key = self._value_keys[t] = _value_key(constants[t])
                inputs.append((k, key))
            else:
                inputs.append(k)
        return (
            node.op_type,
            node.domain,
            tuple([a.SerializeToString() for a in node.attribute]),
            tuple(inputs),
            len(node.output),
        )

    def schema(self, key: tuple[str, str]) -> onnx.defs.OpSchema | None:
        """onnx's schema of ``(domain, op type)`` at the model's opset (None if it has none), cached."""
        if key not in self.schema_cache:
            domain, op_type = key
            try:
                self.schema_cache[key] = onnx.defs.get_schema(op_type, self.default_opset, domain)
            except onnx.defs.SchemaError:
                self.schema_cache[key] = None
        return self.schema_cache[key]

    def infer(self, node: onnx.NodeProto) -> None:
        """The shapes of ``node``'s outputs, by a rule or by onnx (Constant nodes neither)."""
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        key = (domain, node.op_type)
        # onnxruntime registers some of its ops in the default domain (LayerNormalization below
        # opset 17, SimplifiedLayerNormalization): onnx has no schema for them there, the rules do.
        by_rule = node.op_type in RULES and (domain == MS or (domain == "" and self.schema(key) is None))
        if by_rule:
            self.infer_by_rule(node)
        elif domain == "" and node.op_type != "Constant":
            self.infer_by_onnx(node, self.schema(key))

    def infer_by_rule(self, node: onnx.NodeProto) -> None:
        """The outputs of a contrib op (or one onnx has no schema for) from its rule in :data:`RULES`."""
        sizes = self.sizes
        known = [self.known(t) for t in node.input]
        signature = ("rule", *self._signature(node, known, values=False))
        results = self._inferred.get(signature)
        if results is None:
            types, shapes = zip(*known) if known else ((), ())
            try:
                results = RULES[node.op_type](list(shapes), list(types), node_attrs(node))
            except (IndexError, KeyError, TypeError, ValueError):
                results = []
            self._inferred[signature] = results
        for o, r in zip(node.output, results):
            if r is not None and o and not sizes.declared(o) and self.add(o, r[0], r[1]):
                self.report.by_rule += 1

    def infer_by_onnx(self, node: onnx.NodeProto, schema: onnx.defs.OpSchema | None) -> None:
        """The outputs of a standard op from onnx's inference of the node alone, once every input's
        type is known; only outputs whose every dimension it gives count."""
        sizes = self.sizes
        if schema is None:
            return
        known = [self.known(t) if t else (None, None) for t in node.input]
        if not all(k[0] for t, k in zip(node.input, known) if t):
            return
        signature = self._signature(node, known, values=True)
        outputs = self._inferred.get(signature)
        if outputs is None:
            input_types: dict[str, onnx.TypeProto] = {}
            for t, (et, dims) in zip(node.input, known):
                if t and et:  # (every input's type is known: checked above)
                    input_types[t] = (
                        _type_proto(et, dims) if dims is not None else helper.make_tensor_type_proto(et, None)
                    )
            data = {t: self.constants[t] for t in node.input if t in self.constants}
            outputs = self._inferred[signature] = self._onnx_outputs(schema, node, input_types, data)
        for o, found in zip(node.output, outputs):
            if found is None or not o or sizes.declared(o):
                continue
            elem_type, out_dims = found
            if self.add(o, elem_type or sizes.elem_type(o), out_dims):
                self.report.by_onnx += 1

    def _onnx_outputs(
        self,
        schema: onnx.defs.OpSchema,
        node: onnx.NodeProto,
        input_types: dict[str, onnx.TypeProto],
        data: dict[str, TensorProto],
    ) -> list[tuple[int, tuple[Dim, ...]] | None]:
        """Per output of ``node``: onnx's (element type, dims) where it gives every dimension, else None."""
        try:
            inferred = onnx.shape_inference.infer_node_outputs(
                schema,
                node,
                input_types,
                data,
                opset_imports=[helper.make_opsetid("", self.default_opset)],
            )
        except Exception:  # inference failing is a lack of information, not an error
            inferred = {}
        outputs: list[tuple[int, tuple[Dim, ...]] | None] = []
        for o in node.output:
            tp = inferred.get(o) if o else None
            if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
                outputs.append(None)
                continue
            tt = tp.tensor_type
            out_dims = tuple(
                int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim
            )
            outputs.append(None if any(d is None for d in out_dims) else (tt.elem_type, out_dims))
        return outputs
