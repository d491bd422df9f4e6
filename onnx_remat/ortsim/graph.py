"""The graph onnxruntime holds: nodes by *node index* (what its execution order depends on), tensor
facts, and the edits its graph rewrites make (:mod:`onnx_remat.ortsim.rewrites`).

:func:`runtime_graph` loads an ``onnx.ModelProto`` as onnxruntime does (``Constant`` nodes become
initializers); new nodes get the next free index and removed ones leave holes, as in onnxruntime.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.external_data_helper import uses_external_data

from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.graph.conventions import RANDOM_OPS
from onnx_remat.ortsim.order import compiled_default_order, default_order, priority_order

FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)
# Nodes common-subexpression elimination never merges and constant folding never evaluates: the
# random ops, and DropoutGrad, which (like Dropout) onnxruntime treats as not deterministic.
NOT_MERGED = RANDOM_OPS | {"DropoutGrad"}
EVERY_NODE = -1  # in RuntimeGraph.touched: an edit that may have changed any node
_INT64_MAX = 2**63 - 1
_SHAPE_OP_TYPES = frozenset({"Shape", "Size"})  # (default domain) run right after their input's producer


def element_count(dims: Iterable[int]) -> int:
    """``int(np.prod(dims, dtype=np.int64))``, computed without numpy (asked once per initializer,
    where numpy's per-call overhead dominated); numpy's wrapped value where int64 overflows."""
    dims = list(dims)
    count = math.prod(dims)
    if -_INT64_MAX <= count <= _INT64_MAX:
        return count
    return int(np.prod(dims, dtype=np.int64))


@dataclass(eq=False, slots=True)  # slots: tens of thousands per graph, read in every pass
class RuntimeNode:
    """One node as onnxruntime holds it: ``index`` orders the DEFAULT execution order; ``attrs``
    its attributes as Python values (:func:`node_attrs`)."""

    index: int
    name: str
    op: str
    domain: str
    # Never changed in place: an edit gives the node a new list. A node's lists are the ones
    # node_io read (runtime_graph), which the emulation keeps for later graphs with the same nodes
    # (the memory schedule's written graphs: Emulation.io), and which those graphs' nodes share.
    inputs: list[str]
    outputs: list[str]
    # The attributes, or the model's node to read them from when first asked: most nodes' are
    # never asked for (only the few op types a rewrite looks at, and nodes CSE finds otherwise
    # equal), and reading them was a large part of loading a graph.
    _attrs: dict | onnx.NodeProto
    origin: tuple[str, ...]  # names of the model's nodes this node stands for

    @property
    def attrs(self) -> dict:
        attrs = self._attrs
        if isinstance(attrs, onnx.NodeProto):
            attrs = self._attrs = node_attrs(attrs)
        return attrs

    @property
    def key(self) -> tuple[str, str]:
        return (self.domain, self.op)

    def same_attrs(self, other: RuntimeNode) -> bool:
        """Whether ``other`` has the same attributes, without reading them where both are still
        their model nodes' (compared as protos: reading each node's attributes was most of
        comparing two emulations step by step)."""
        mine, theirs = self._attrs, other._attrs
        if (
            isinstance(mine, onnx.NodeProto)
            and isinstance(theirs, onnx.NodeProto)
            and (mine is theirs or mine.attribute == theirs.attribute)
        ):
            return True
        return self.attrs == other.attrs


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
    # The DEFAULT order and the graph state it was computed for: every edit the optimizer makes is
    # counted in ``rewrites`` (or adds a node), so an unchanged count means an unchanged graph. The
    # fixed-point loops ask for the order once per pass, and most passes change nothing.
    _order: tuple[tuple[int, int], list[int]] | None = field(default=None, repr=False)
    # Live nodes per (domain, op), kept by add / remove: a pass asks has_op before each run.
    _op_counts: Counter = field(default_factory=Counter, repr=False)
    # Counts every edit made through the methods below (and the passes' own edits of inputs and
    # outputs): the optimizer skips a pass that changed nothing when nothing changed since.
    edits: int = field(default=0, repr=False)
    # The nodes edits added, removed or changed (op, inputs, outputs, attributes), by index, in the
    # order edited (repeats kept; ``EVERY_NODE`` where an edit may have changed any node): a pass
    # that keeps what its last walk found (``kept``) reads what changed since rather than walking
    # the whole graph again. Node indices are never reused.
    touched: list[int] = field(default_factory=list, repr=False)
    # What a pass keeps between its walks of this graph, by the pass's name (see ``touched``).
    kept: dict[str, object] = field(default_factory=dict, repr=False)
    # What every memory plan of this graph reads of it whatever the order, with the graph state it
    # was read for (onnx_remat.ortsim.planner: made on the first plan, or before a fork that plans).
    plan_tables: object = field(default=None, repr=False)
    plan_arrays: object = field(default=None, repr=False)  # the same, numbered for the compiled walk

    def __post_init__(self) -> None:
        self.graph_output_set = set(self.graph_outputs)
        self._op_counts = Counter((n.domain, n.op) for n in self.nodes if n is not None)

    # -- structure --------------------------------------------------------------------------

    def at(self, index: int) -> RuntimeNode:
        """The node of ``index``, which must not have been removed (e.g. an index of an order)."""
        node = self.nodes[index]
        assert node is not None, f"node {index} was removed"
        return node

    def live(self) -> list[RuntimeNode]:
        return [n for n in self.nodes if n is not None]

    def reindex(self) -> None:
        """Rebuild the producer / consumer maps (one entry per input occurrence)."""
        self._order = None
        self.edits += 1
        self.touched.append(EVERY_NODE)  # called after edits made outside the methods below
        producer: dict[str, int] = {}
        consumers: dict[str, list[int]] = {}
        self.producer, self.consumers = producer, consumers
        self._prods = {}
        live = self.live()
        self._op_counts = Counter((n.domain, n.op) for n in live)
        for n in live:
            index = n.index
            for o in n.outputs:
                if o:
                    producer[o] = index
            for t in n.inputs:
                if t:
                    readers = consumers.get(t)
                    if readers is None:
                        consumers[t] = [index]
                    else:
                        readers.append(index)

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
        return not self.graph_output_set.isdisjoint(node.outputs)

    def has_op(self, *keys: tuple[str, str]) -> bool:
        """True if some live node has one of the (domain, op) ``keys``."""
        counts = self._op_counts
        return any(counts[key] > 0 for key in keys)

    def is_constant(self, tensor: str) -> bool:
        return tensor in self.constants

    # -- edits that keep the maps consistent ------------------------------------------------

    def touch(self, node: RuntimeNode) -> None:
        """Log an edit a pass made to ``node`` itself, outside the methods below (its inputs,
        outputs or attributes; the pass counts it in ``edits``)."""
        self.touched.append(node.index)

    def remove(self, node: RuntimeNode) -> None:
        self._order = None
        self.edits += 1
        self.touched.append(node.index)
        if self.nodes[node.index] is node:  # not counted twice if removed twice
            self._op_counts[(node.domain, node.op)] -= 1
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

    def add(
        self, name: str, op: str, domain: str, inputs: list[str], outputs: list[str], attrs: dict, origin: Iterable[str]
    ) -> RuntimeNode:
        node = RuntimeNode(len(self.nodes), name, op, domain, list(inputs), list(outputs), dict(attrs), tuple(origin))
        self.nodes.append(node)
        self.edits += 1
        self.touched.append(node.index)
        self._op_counts[(domain, op)] += 1
        self._touch_readers(o for o in node.outputs if o)
        for o in node.outputs:
            if o:
                self.producer[o] = node.index
        for t in node.inputs:
            if t:
                self.consumers.setdefault(t, []).append(node.index)
        return node

    def replace_input(self, node: RuntimeNode, old: str, new: str) -> None:
        self._order = None
        self.edits += 1
        self.touched.append(node.index)
        self._prods.pop(node.index, None)
        inputs = node.inputs = node.inputs[:]  # a new list: see RuntimeNode.inputs
        for k, t in enumerate(inputs):
            if t == old:
                inputs[k] = new
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
        """onnxruntime's DEFAULT execution order of the current graph (node indices; a new list)."""
        state = (sum(self.rewrites.values()), len(self.nodes))
        if self._order is not None and self._order[0] == state:
            return list(self._order[1])
        order = self._default_order()
        self._order = (state, order)
        return list(order)

    def _default_order(self) -> list[int]:
        indices: list[int] = []
        follow: dict[int, int] = {}
        cached, producer = self._prods, self.producer
        for n in self.nodes:
            if n is None:
                continue
            index = n.index
            indices.append(index)
            if index not in cached:  # producers_of, inlined: asked for every node of every order
                cached[index] = [producer[t] for t in n.inputs if t in producer]
            if n.op in _SHAPE_OP_TYPES and n.domain == "":
                ps = cached[index]
                if ps:
                    follow[index] = ps[0]
        compiled = compiled_default_order(indices, cached, follow)
        if compiled is not None:
            return compiled
        # The cache now holds every live node's producers (and no removed node's): the nodes with
        # a consumer are theirs, gathered in one C-level pass rather than a set update per node.
        has_consumer = set(chain.from_iterable(map(cached.__getitem__, indices)))
        return default_order(indices, cached, has_consumer, follow)

    def priority_order(self) -> list[int]:
        live = self.live()
        producers = {n.index: self.producers_of(n) for n in live}
        return priority_order([n.index for n in live], producers, {n.index: n.op for n in live})


_INT, _FLOAT, _INTS = onnx.AttributeProto.INT, onnx.AttributeProto.FLOAT, onnx.AttributeProto.INTS


def node_attrs(proto: onnx.NodeProto) -> dict:
    """A node's attributes as Python values (``helper.get_attribute_value``; the common scalar and
    integer-list types read directly, since every node of every emulated graph is read)."""
    attrs = {}
    for a in proto.attribute:
        kind = a.type
        if kind == _INT and not a.ref_attr_name:
            attrs[a.name] = a.i
        elif kind == _FLOAT and not a.ref_attr_name:
            attrs[a.name] = a.f
        elif kind == _INTS and not a.ref_attr_name:
            attrs[a.name] = list(a.ints)
        else:
            attrs[a.name] = helper.get_attribute_value(a)
    return attrs


# The input and the output names of each node of a model's graph, in node order, as new lists.
NodeIO = tuple[list[list[str]], list[list[str]]]


def node_io(model: onnx.ModelProto) -> NodeIO:
    """The input and output names of each of ``model``'s nodes (new lists, which the reader may
    keep). Read once where both :func:`~onnx_remat.ortsim.shapes.infer_runtime_shapes` and
    :func:`runtime_graph` read a model: each read of a proto's repeated field makes new strings,
    and every node of every emulated graph is read."""
    return nodes_io(model.graph.node)


def nodes_io(nodes: Sequence[onnx.NodeProto]) -> NodeIO:
    """:func:`node_io` of these nodes (a model's node list, or its nodes in another order)."""
    return [n.input[:] for n in nodes], [n.output[:] for n in nodes]  # [:] is faster than list()


def runtime_graph(
    model: onnx.ModelProto,
    sizes: TensorSizes,
    *,
    max_constant_elements: int = 64,
    io: NodeIO | None = None,
    protos: Sequence[onnx.NodeProto] | None = None,
) -> RuntimeGraph:
    """The model as onnxruntime loads it (``Constant`` nodes turned into initializers), unoptimized.

    ``io``: :func:`node_io` of ``model``, if read already; its lists become the nodes' (which no
    edit changes in place: :class:`RuntimeNode`), so it may still be read. ``protos``: nodes equal
    to ``model``'s, read in their place: those of the model a graph's node list was copied from
    (:class:`~onnx_remat.scheduling.realize.LeafPlacer`), so that two emulations' nodes hold the
    same node objects to read attributes from, and compare them as the same
    (:meth:`RuntimeNode.same_attrs`)."""
    g = model.graph
    all_inputs, all_outputs = io if io is not None else node_io(model)
    inputs = [v.name for v in g.input]
    input_set = set(inputs)
    inits: dict[str, onnx.TensorProto] = {}
    for t in g.initializer:
        if element_count(t.dims) <= max_constant_elements and not t.external_data:
            inits[t.name] = t
        else:
            stub = onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims)
            inits[t.name] = stub
    nodes: list[RuntimeNode | None] = []
    # The producer / consumer maps are built as the nodes are read (what ``reindex`` builds, in
    # the same order), rather than in a second walk over every node; so are the producers of each
    # node (``producers_of``, which the first DEFAULT order asks of every node), valid unless some
    # node writes a tensor an earlier node wrote or read (a graph not sorted: then left to be
    # computed on demand).
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = {}
    prods: dict[int, list[int]] = {}
    sorted_graph = True
    for proto, ins, outputs in zip(g.node if protos is None else protos, all_inputs, all_outputs, strict=True):
        domain = proto.domain
        if domain == "ai.onnx":
            domain = ""
        op = proto.op_type
        if op == "Constant" and domain == "" and len(outputs) == 1:
            value = next(
                (a.t for a in proto.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None
            )
            if value is not None:
                t = onnx.TensorProto()
                t.CopyFrom(value)
                t.name = outputs[0]
                inits[t.name] = t
                continue
        name = proto.name
        index = len(nodes)
        nodes.append(RuntimeNode(index, name, op, domain, ins, outputs, proto, (name,)))
        for o in outputs:
            if o:
                if o in producer or o in consumers:
                    sorted_graph = False
                producer[o] = index
        ps = prods[index] = []
        for t in ins:
            if t:
                readers = consumers.get(t)
                if readers is None:
                    consumers[t] = [index]
                else:
                    readers.append(index)
                p = producer.get(t)
                if p is not None:
                    ps.append(p)
    rg = RuntimeGraph(
        nodes=nodes,
        graph_inputs=inputs,
        graph_outputs=[v.name for v in g.output],
        initializers=inits,
        constants={n for n in inits if n not in input_set},
        sizes=sizes,
        opset=next((op.version for op in model.opset_import if op.domain in ("", "ai.onnx")), 0),
        producer=producer,
        consumers=consumers,
        _prods=prods if sorted_graph else {},
    )
    return rg


def constant_value(rg: RuntimeGraph, name: str) -> np.ndarray | None:
    if name in rg._values:
        return rg._values[name]
    value = _read_constant(rg, name)
    rg._values[name] = value
    return value


# Element types whose values ``numpy_helper.to_array`` reads from a typed field (when the tensor
# has no raw or external data) as ``np.asarray(field, dtype)``: read here the same way, from a list
# (several times faster; ConstantSharing reads every small initializer).
_TYPED_FIELDS: dict[int, tuple[str, type]] = {
    onnx.TensorProto.INT64: ("int64_data", np.int64),
    onnx.TensorProto.FLOAT: ("float_data", np.float32),
    onnx.TensorProto.INT32: ("int32_data", np.int32),
    onnx.TensorProto.DOUBLE: ("double_data", np.float64),
}


def _read_constant(rg: RuntimeGraph, name: str) -> np.ndarray | None:
    t = rg.initializers.get(name)
    if t is None:
        return None
    if not (t.raw_data or t.float_data or t.int64_data or t.int32_data or t.double_data) and element_count(t.dims) != 0:
        return None
    try:
        typed = _TYPED_FIELDS.get(t.data_type)
        if typed is not None and not (t.HasField("raw_data") or t.HasField("segment") or uses_external_data(t)):
            field_name, dtype = typed
            return np.array(list(getattr(t, field_name)), dtype=dtype).reshape(tuple(t.dims))
        return numpy_helper.to_array(t)
    except Exception:
        return None


def rank(rg: RuntimeGraph, tensor: str) -> int | None:
    dims = rg.sizes.raw_dims(tensor) if rg.sizes.declared(tensor) else None
    return None if dims is None else len(dims)
