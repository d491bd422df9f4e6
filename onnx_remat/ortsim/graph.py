"""The graph onnxruntime holds: nodes by *node index* (what its execution order depends on), tensor
facts, and the edits its graph rewrites make (:mod:`onnx_remat.ortsim.rewrites`).

:func:`runtime_graph` loads an ``onnx.ModelProto`` as onnxruntime does (``Constant`` nodes become
initializers); new nodes get the next free index and removed ones leave holes, as in onnxruntime.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.graph.conventions import RANDOM_OPS
from onnx_remat.ortsim.order import default_order, priority_order

FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)
# Nodes common-subexpression elimination never merges and constant folding never evaluates: the
# random ops, and DropoutGrad, which (like Dropout) onnxruntime treats as not deterministic.
NOT_MERGED = RANDOM_OPS | {"DropoutGrad"}


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
    # The DEFAULT order and the graph state it was computed for: every edit the optimizer makes is
    # counted in ``rewrites`` (or adds a node), so an unchanged count means an unchanged graph. The
    # fixed-point loops ask for the order once per pass, and most passes change nothing.
    _order: tuple[tuple[int, int], list[int]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.graph_output_set = set(self.graph_outputs)

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
        return not self.graph_output_set.isdisjoint(node.outputs)

    def has_op(self, *keys: tuple[str, str]) -> bool:
        """True if some live node has one of the (domain, op) ``keys``."""
        wanted = set(keys)
        return any(n is not None and (n.domain, n.op) in wanted for n in self.nodes)

    def is_constant(self, tensor: str) -> bool:
        return tensor in self.constants

    # -- edits that keep the maps consistent ------------------------------------------------

    def remove(self, node: RuntimeNode) -> None:
        self._order = None
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
        """onnxruntime's DEFAULT execution order of the current graph (node indices; a new list)."""
        state = (sum(self.rewrites.values()), len(self.nodes))
        if self._order is not None and self._order[0] == state:
            return list(self._order[1])
        order = self._default_order()
        self._order = (state, order)
        return list(order)

    def _default_order(self) -> list[int]:
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


def node_attrs(proto: onnx.NodeProto) -> dict:
    """A node's attributes as Python values."""
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
            RuntimeNode(
                len(nodes),
                proto.name,
                proto.op_type,
                domain,
                list(proto.input),
                list(proto.output),
                node_attrs(proto),
                (proto.name,),
            )
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


def constant_value(rg: RuntimeGraph, name: str) -> np.ndarray | None:
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


def rank(rg: RuntimeGraph, tensor: str) -> int | None:
    dims = rg.sizes.raw_dims(tensor) if rg.sizes.declared(tensor) else None
    return None if dims is None else len(dims)
