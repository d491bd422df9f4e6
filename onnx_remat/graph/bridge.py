"""onnx.ModelProto <-> onnx-graphsurgeon graph, without losing what graphsurgeon drops.

onnx-remat edits graphs with onnx-graphsurgeon (consistent producer/consumer edges, easy cloning).
Measured on onnx-graphsurgeon 0.6.1, a plain ``import_onnx``/``export_onnx`` round trip

* drops every node's ``doc_string`` (generate_artifacts marks gradient nodes "Backward pass")
  and ``metadata_props`` (the dynamo exporter's scope information),
* writes initializers in another order and drops unused ones, drops the ``value_info`` of some
  tensors and the
  ``metadata_props`` of graph inputs and outputs,
* rebuilds the ModelProto, so model-level fields must be copied back,
* and its ``Graph.toposort()`` is recursive (RecursionError on long out-of-order chains).

It is also slow where onnx-remat needs it fast: ``import_onnx`` builds ~10 objects per node through
constructors that keep both ends of every edge in step (1.1 s CPU for a 21k-node graph), and
``export_onnx`` writes the value_info of every tensor (the source's are kept instead) and copies
every initializer into a model that is then rebuilt around the source's fields.

This module is the one place that works around all of that: :func:`import_graph` builds the graph
``import_onnx`` would, without those constructors; :class:`ModelGraph` keeps the
dropped per-node fields in a side table and :meth:`ModelGraph.to_model` puts them back; the
iterative :func:`onnx_remat.graph.toposort.stable_toposort` replaces graphsurgeon's toposort. A round
trip without edits reproduces the input model byte for byte (tests/graph/test_bridge.py).
:meth:`ModelGraph.copy` copies an imported graph without importing it again (a pass that edits a
graph edits a copy, so its input stays as it was), and :meth:`ModelGraph.to_model` writes nodes and
tensors as graphsurgeon's exporter does but assembles the model itself: it writes only the value_info
it keeps and copies each initializer once (the parameters can be most of the model).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter, check_duplicate_node_names, dtype_to_onnx
from onnx_graphsurgeon.importers.onnx_importer import (
    OnnxImporter,
    get_onnx_tensor_dtype,
    get_onnx_tensor_shape,
    get_onnx_tensor_type,
)
from onnx_graphsurgeon.ir.tensor import LazyValues, SparseValues
from onnx_graphsurgeon.util.misc import SynchronizedList

from onnx_remat import collector
from onnx_remat.graph.conventions import SUBGRAPH_ATTRIBUTES
from onnx_remat.graph.proto_copy import copy_except


def _cut(obj: gs.Node | gs.Tensor) -> None:
    """Empty ``obj``'s edge lists and unhook them from it (each SynchronizedList refers back to its
    owner: a cycle per object). list.clear, not the SynchronizedList's own clear, which would
    update the other end of every edge, cut here as well."""
    for edges in (obj.inputs, obj.outputs):
        list.clear(edges)
        edges.parent_obj = None


@dataclass
class NodeExtras:
    """The per-node fields graphsurgeon does not carry."""

    doc_string: str = ""
    metadata: dict[str, str] = field(default_factory=dict)


class ModelGraph:
    """A graphsurgeon graph plus everything needed to write the model back unchanged.

    ``graph`` is the :class:`onnx_graphsurgeon.Graph`; edit it freely. Nodes added later get
    their doc string and metadata through :meth:`set_extras`. Nodes are keyed by ``id()``
    (graphsurgeon nodes are unhashable); the graph's node list keeps them alive.
    """

    def __init__(self, model: onnx.ModelProto):
        self._source = model
        with collector.paused():
            self.graph: gs.Graph = import_graph(model)
        self._extras: dict[int, NodeExtras] = {}
        for node, proto in zip(self.graph.nodes, model.graph.node):
            if proto.doc_string or proto.metadata_props:
                self._extras[id(node)] = NodeExtras(proto.doc_string, {p.key: p.value for p in proto.metadata_props})

    def extras(self, node: gs.Node) -> NodeExtras:
        """Doc string and metadata of ``node`` (empty ones if it has none)."""
        return self._extras.get(id(node)) or NodeExtras()

    def set_extras(self, node: gs.Node, doc_string: str = "", metadata: dict[str, str] | None = None) -> None:
        """Give ``node`` a doc string and metadata to be written by :meth:`to_model`."""
        self._extras[id(node)] = NodeExtras(doc_string, dict(metadata or {}))

    @property
    def source(self) -> onnx.ModelProto:
        """The model this graph was imported from (not modified by edits to ``graph``)."""
        return self._source

    def release(self) -> None:
        """Break the graph's node <-> tensor reference cycles; the graph is unusable afterwards.

        Call it on a graph nothing will read again (a rewrite's working copy once its model is
        written): reference counting then frees its ~10 objects per node at once. Left cyclic,
        they wait for the cyclic collector, whose passes over them cost more than the rewrite's
        export at 10^4-10^5 nodes (measured: 1.9 s of a 21k-node ``apply``).
        """
        for node in self.graph.nodes:
            for t in node.inputs:
                _cut(t)
            for t in node.outputs:
                _cut(t)
            _cut(node)
        for t in (*self.graph.inputs, *self.graph.outputs):
            _cut(t)
        self.graph.nodes = []
        self._extras = {}

    def copy(self) -> GraphCopy:
        """An independent copy of this graph, as if imported again (0.44 s instead of 1.1 s CPU on 21k nodes).

        New nodes and tensors with the same edges, in the same order; what never changes in place
        is shared: constant values (lazy references into the source ModelProto, or arrays), attribute
        values (the attrs dicts are copied), dtypes. Constants of the source whose values were read
        since the import (reading ``Constant.values`` replaces the lazy reference with an array) get
        a lazy reference again, so the copy exports them as a fresh import would. Graphs with
        subgraphs or local functions, whose tensors span several graphs, are imported again.
        """
        if self.spans_graphs():
            return self._imported_again()
        with collector.paused():
            return self._copied()

    def spans_graphs(self) -> bool:
        """Whether the graph has subgraphs or local functions (:meth:`copy` imports it again)."""
        graph = self.graph
        return bool(graph.functions) or any(isinstance(v, gs.Graph) for n in graph.nodes for v in n.attrs.values())

    def _copied(self) -> GraphCopy:
        # Objects are made with __new__ and their __dict__ filled: the constructors and
        # SynchronizedList.extend update the other end of every edge, one call per edge, and both
        # ends are copied here anyway.
        graph = self.graph
        nodes: dict[int, gs.Node] = {}
        tensors: dict[int, gs.Tensor] = {}
        pairs: list[tuple[gs.Tensor, gs.Tensor]] = []
        sources: dict[str, onnx.TensorProto] | None = None

        def add(t: gs.Tensor) -> None:
            nonlocal sources
            c = object.__new__(type(t))
            d = c.__dict__
            d.update(t.__dict__)
            d["inputs"] = _synced(c, "outputs")
            d["outputs"] = _synced(c, "inputs")
            shape = d.get("shape")
            if type(shape) is list:
                d["shape"] = list(shape)
            values = d.get("_values")
            if values is not None and not isinstance(values, (LazyValues, SparseValues)):
                if sources is None:
                    sources = self._initializers()
                proto = sources.get(t.name)
                if proto is not None:
                    d["_values"] = LazyValues(proto)
            tensors[id(t)] = c
            pairs.append((t, c))

        for t in graph.inputs:
            if id(t) not in tensors:
                add(t)
        for n in graph.nodes:
            c = object.__new__(type(n))
            d = c.__dict__
            d.update(n.__dict__)
            d["attrs"] = n.attrs.copy()
            d["inputs"] = _synced(c, "outputs")
            d["outputs"] = _synced(c, "inputs")
            nodes[id(n)] = c
            for t in n.inputs:
                if id(t) not in tensors:
                    add(t)
            for t in n.outputs:
                if id(t) not in tensors:
                    add(t)
        for t in graph.outputs:
            if id(t) not in tensors:
                add(t)
        for n in graph.nodes:
            c = nodes[id(n)]
            list.extend(c.inputs, [tensors[id(t)] for t in n.inputs])
            list.extend(c.outputs, [tensors[id(t)] for t in n.outputs])
        for t, c in pairs:
            # a node outside graph.nodes is not part of the graph (nor of a fresh import of it)
            list.extend(c.inputs, [nodes[id(p)] for p in t.inputs if id(p) in nodes])
            list.extend(c.outputs, [nodes[id(r)] for r in t.outputs if id(r) in nodes])

        g = object.__new__(type(graph))
        g.__dict__.update(graph.__dict__)
        g.__dict__.update(
            nodes=[nodes[id(n)] for n in graph.nodes],
            inputs=[tensors[id(t)] for t in graph.inputs],
            outputs=[tensors[id(t)] for t in graph.outputs],
            _functions=[],
        )
        extras = {
            id(nodes[k]): NodeExtras(e.doc_string, dict(e.metadata)) for k, e in self._extras.items() if k in nodes
        }
        return GraphCopy(ModelGraph._of(self._source, g, extras), nodes, tensors)

    def _initializers(self) -> dict[str, onnx.TensorProto]:
        return {p.name: p for p in self._source.graph.initializer}

    def unread_constants(self) -> None:
        """Give each constant whose values were read since the import its lazy reference to the
        source's TensorProto again (reading ``Constant.values`` replaces it with an array), so that
        :meth:`to_model` writes it as after a fresh import: for a graph edited in place (a forked
        child's own copy of it), what :meth:`copy` does for its copy. The graph's own tensors: a
        graph that :meth:`spans_graphs` is not edited in place."""
        sources: dict[str, onnx.TensorProto] | None = None
        seen: set[int] = set()
        for tensors in _tensor_lists(self.graph):
            for t in tensors:
                if type(t) is not gs.Constant or id(t) in seen:
                    continue
                seen.add(id(t))
                if isinstance(t._values, (LazyValues, SparseValues)):
                    continue
                if sources is None:
                    sources = self._initializers()
                proto = sources.get(t.name)
                if proto is not None:
                    t._values = LazyValues(proto)

    def _imported_again(self) -> GraphCopy:
        """The copy for graphs :meth:`copy` does not copy: node i is node i, tensors match by name."""
        mg = ModelGraph(self._source)
        nodes = {id(a): b for a, b in zip(self.graph.nodes, mg.graph.nodes)}
        by_name = mg.graph.tensors()
        tensors = {id(t): by_name[name] for name, t in self.graph.tensors().items() if name in by_name}
        return GraphCopy(mg, nodes, tensors)

    @classmethod
    def _of(cls, source: onnx.ModelProto, graph: gs.Graph, extras: dict[int, NodeExtras]) -> ModelGraph:
        mg = cls.__new__(cls)
        mg._source = source
        mg.graph = graph
        mg._extras = extras
        return mg

    def to_model(
        self, extra_opsets: dict[str, int] | None = None, metadata: dict[str, str] | None = None
    ) -> onnx.ModelProto:
        """Export the (edited) graph as a ModelProto that keeps the source model's fields.

        ``extra_opsets`` adds opset imports for domains the edits introduced (an existing
        import of the same domain is kept as it is); ``metadata`` adds or replaces model-level
        ``metadata_props``.

        The graph is what ``gs.export_onnx`` writes, with what it drops put back (the module
        docstring); everything else in the model is the source's.
        """
        src = self._source
        out = copy_except(src, "graph")
        with collector.paused():
            _export_graph(self.graph, self._extras, src.graph, out.graph)

        have = {op.domain for op in out.opset_import}
        for domain, version in (extra_opsets or {}).items():
            if domain not in have:
                out.opset_import.add(domain=domain, version=version)
        if metadata:
            kept = [(p.key, p.value) for p in out.metadata_props if p.key not in metadata]
            del out.metadata_props[:]
            for key, value in kept + list(metadata.items()):
                out.metadata_props.add(key=key, value=value)
        return out


@dataclass
class GraphCopy:
    """A :meth:`ModelGraph.copy` and where each node and tensor of the original went."""

    mg: ModelGraph
    nodes: dict[int, gs.Node]  # id(original node) -> its copy
    tensors: dict[int, gs.Tensor]  # id(original tensor) -> its copy

    def node(self, node: gs.Node) -> gs.Node:
        return self.nodes[id(node)]

    def tensor(self, tensor: gs.Tensor) -> gs.Tensor:
        return self.tensors[id(tensor)]


def import_graph(model: onnx.ModelProto) -> gs.Graph:
    """``gs.import_onnx(model)``, the same graph built about 2x faster (models with local functions,
    sparse initializers or subgraphs go to ``gs.import_onnx`` itself).

    Tensors are made as graphsurgeon's importer makes them (its own ``import_tensor`` for
    initializers and attribute tensors, its own dtype/shape/type readers for value_info, the
    same precedence between initializers, value_info, graph inputs and outputs); nodes and
    variables are built with ``__new__`` and their edge lists filled directly, where the
    constructors add each edge through ``SynchronizedList`` one call at a time (a third of the
    import). tests/graph/test_bridge_copy.py compares both imports object by object.
    """
    graph = model.graph
    if (
        model.functions
        or graph.sparse_initializer
        or any(a.type in SUBGRAPH_ATTRIBUTES for n in graph.node for a in n.attribute)
    ):
        return gs.import_onnx(model)
    opset = OnnxImporter.get_opset(model)
    domains = OnnxImporter.get_import_domains(model)
    tensors: dict[str, gs.Tensor] = {}
    for init in graph.initializer:
        if init.name not in tensors:
            tensors[init.name] = OnnxImporter.import_tensor(init)
    variable = _VariableReader()
    for vi in graph.value_info:
        known = tensors.get(vi.name)
        if known is None:
            tensors[vi.name] = variable(vi)
        elif isinstance(known, gs.Variable):  # graphsurgeon keeps what the first one had
            new = variable(vi)
            d = known.__dict__
            d["dtype"] = known.dtype or new.dtype
            d["shape"] = known.shape or new.shape
    initializers = {init.name for init in graph.initializer}
    inputs = [_known(tensors, vi, variable) for vi in graph.input if vi.name not in initializers]
    outputs = [_known(tensors, vi, variable) for vi in graph.output]
    empty_attrs: dict = {}
    nodes = []
    for proto in graph.node:
        node = object.__new__(gs.Node)
        node_inputs = [_named(tensors, name) for name in proto.input]
        node_outputs = [_named(tensors, name) for name in proto.output]
        attrs = (
            OnnxImporter.import_attributes(proto.attribute, empty_attrs, tensors, opset, domains)
            if proto.attribute
            else OrderedDict()
        )
        node.__dict__.update(
            op=proto.op_type,
            name=proto.name,
            attrs=attrs,
            inputs=_synced(node, "outputs"),
            outputs=_synced(node, "inputs"),
            domain=proto.domain if proto.HasField("domain") else None,
        )
        list.extend(node.inputs, node_inputs)
        for t in node_inputs:
            list.append(t.outputs, node)
        list.extend(node.outputs, node_outputs)
        for t in node_outputs:
            list.append(t.inputs, node)
        nodes.append(node)
    return gs.Graph(
        nodes=nodes,
        inputs=inputs,
        outputs=outputs,
        name=graph.name,
        doc_string=graph.doc_string,
        producer_name=model.producer_name,
        producer_version=model.producer_version,
        opset=opset,
        import_domains=domains,
        functions=[],
        ir_version=model.ir_version,
    )


def tensor_map(graph: gs.Graph) -> dict[str, gs.Tensor]:
    """``graph.tensors()``: name -> tensor for every tensor of the graph's inputs, its nodes'
    inputs and outputs (node by node) and its outputs, in that order, empty names left out.

    graphsurgeon's makes two calls per edge, this one none: 0.40 s against 0.25 s at 10^5 nodes, at
    every analysis and export. Where two distinct tensors share a name, graphsurgeon's own is
    returned: it warns, and the later one is kept."""
    found: dict[str, gs.Tensor] = {}
    keep = found.setdefault
    for tensors in _tensor_lists(graph):
        for t in tensors:
            if keep(t.name, t) is not t and t.name:
                return graph.tensors()
    found.pop("", None)
    return found


def _tensor_lists(graph: gs.Graph) -> Iterator[list[gs.Tensor]]:
    """The graph's inputs, each node's inputs and outputs, and the graph's outputs, in that order
    (graphsurgeon's ``Graph.tensors``)."""
    yield graph.inputs
    for node in graph.nodes:
        yield node.inputs
        yield node.outputs
    yield graph.outputs


def new_variable(name: str, dtype=None, shape=None, type: str = "tensor_type") -> gs.Variable:
    """``gs.Variable(name, dtype, shape, type)`` without its constructor: the same object (its
    ``__setattr__`` hook and its ``SynchronizedList`` constructors, called per field and per
    edge, are most of making one). For edits that make tens of thousands of tensors (a rewrite's
    clones at 10^5 nodes); tests/graph/test_bridge_copy.py compares the objects."""
    v = object.__new__(gs.Variable)
    v.__dict__.update(
        name=name, inputs=_synced(v, "outputs"), outputs=_synced(v, "inputs"), dtype=dtype, shape=shape, type=type
    )
    return v


def new_node(
    op: str,
    name: str | None = None,
    attrs: dict | None = None,
    inputs: Sequence[gs.Tensor] = (),
    outputs: Sequence[gs.Tensor] = (),
    domain: str | None = None,
) -> gs.Node:
    """``gs.Node(op, name, attrs, inputs, outputs, domain)`` without its constructor: the same
    object, its edges added to both ends as ``SynchronizedList`` adds them (see
    :func:`new_variable`)."""
    node = object.__new__(gs.Node)
    node.__dict__.update(
        op=op,
        name=name if name is not None else "",
        attrs=attrs if attrs is not None else OrderedDict(),
        inputs=_synced(node, "outputs"),
        outputs=_synced(node, "inputs"),
        domain=domain,
    )
    if inputs:
        inputs = list(inputs)
        list.extend(node.inputs, inputs)
        for t in inputs:
            list.append(t.outputs, node)
    if outputs:
        outputs = list(outputs)
        list.extend(node.outputs, outputs)
        for t in outputs:
            list.append(t.inputs, node)
    return node


class _VariableReader:
    """The tensor graphsurgeon's ``import_tensor`` makes of a ValueInfoProto, for one import.

    graphsurgeon's readers of a type (dtype, shape, kind) take ~20 us a tensor, and a training
    graph declares the types of 10^5 tensors, most of them alike (the same few shapes in every
    layer): each distinct TypeProto is read once, keyed by its serialization (equal bytes, equal
    fields, so equal readings), and each tensor gets its own copy of the shape list."""

    def __init__(self) -> None:
        self._read: dict[bytes, tuple] = {}

    def __call__(self, vi: onnx.ValueInfoProto) -> gs.Variable:
        type_proto = vi.type
        if type_proto.ByteSize() == 0:
            return new_variable(vi.name)
        key = type_proto.SerializeToString()
        read = self._read.get(key)
        if read is None:
            read = self._read[key] = (get_onnx_tensor_dtype(vi), get_onnx_tensor_shape(vi), get_onnx_tensor_type(vi))
        dtype, shape, kind = read
        return new_variable(vi.name, dtype, list(shape) if shape is not None else None, kind)


def _known(tensors: dict[str, gs.Tensor], vi: onnx.ValueInfoProto, variable: _VariableReader) -> gs.Tensor:
    """A graph input's or output's tensor: the one already imported by that name, else a new one."""
    t = tensors.get(vi.name)
    if t is None:
        t = tensors[vi.name] = variable(vi)
    return t


def _named(tensors: dict[str, gs.Tensor], name: str) -> gs.Tensor:
    """A node's input or output by name: an omitted optional one is a new empty Variable each
    time (graphsurgeon tracks none), an unknown one a new Variable without type or shape."""
    if not name:
        return new_variable("")
    t = tensors.get(name)
    if t is None:
        t = tensors[name] = new_variable(name)
    return t


def _synced(parent: object, field_name: str) -> SynchronizedList:
    """An empty edge list of ``parent``, made without the constructor (see ModelGraph._copied)."""
    edges = SynchronizedList.__new__(SynchronizedList)
    edges.parent_obj = parent
    edges.field_name = field_name
    return edges


def _export_graph(graph: gs.Graph, extras: dict[int, NodeExtras], src: onnx.GraphProto, out: onnx.GraphProto) -> None:
    """Write ``graph`` into the empty ``out`` as ``gs.export_onnx`` would, with the source's fields put back.

    Nodes, inputs, outputs and new tensors' value_info are written as graphsurgeon's exporter writes
    them (partly written out here, for speed; the bridge tests compare). An initializer still holding the
    source's TensorProto (graphsurgeon's lazy values) is that TensorProto, as graphsurgeon writes
    it, and it is copied once, into ``out``; graphsurgeon's exporter would set its name in place
    (a write to the source). Only the value_info of tensors the source has none for is exported:
    the source's is kept as it was.
    """
    nodes = graph.nodes
    check_duplicate_node_names(nodes)
    add = out.node.add
    for node in nodes:
        # OnnxExporter.export_node (onnx.helper.make_node plus the attributes), written in place:
        # its NodeProto would be copied into ``out`` again (~0.3 s per 20k nodes).
        proto = add()
        proto.op_type = node.op
        proto.input.extend([t.name for t in node.inputs])
        proto.output.extend([t.name for t in node.outputs])
        if node.name:
            proto.name = node.name
        if node.domain is not None:
            proto.domain = node.domain
        if node.attrs:
            proto.attribute.extend(OnnxExporter.export_attributes(node.attrs))
        extra = extras.get(id(node))
        if extra is not None:
            if extra.doc_string:
                proto.doc_string = extra.doc_string
            for key, value in extra.metadata.items():
                proto.metadata_props.add(key=key, value=value)
    out.name = graph.name
    out.input.extend(_restored_value_infos(graph.inputs, src.input))
    out.output.extend(_restored_value_infos(graph.outputs, src.output))

    tensors = tensor_map(graph)
    constants = [t for t in tensors.values() if isinstance(t, gs.Constant)]
    sparse = [t for t in constants if isinstance(t._values, SparseValues)]
    out.initializer.extend(
        _initializers([t for t in constants if not isinstance(t._values, SparseValues)], src.initializer)
    )
    out.sparse_initializer.extend(OnnxExporter.export_sparse_tensor_proto(t) for t in sparse)

    # value_info: the source's as it was (edits never delete tensors), then the new tensors' in
    # graphsurgeon's order (tensor map order, graph inputs and outputs and unknown types left out)
    for t in graph.inputs + graph.outputs:
        tensors.pop(t.name, None)
    known = {vi.name for vi in src.value_info}
    out.value_info.extend(src.value_info)
    elem_types: dict[object, int] = {}
    infos = out.value_info
    for name, t in tensors.items():
        if name in known or not isinstance(t, gs.Variable) or (t.dtype is None and t.shape is None):
            continue
        if _plain(t):
            _fill_value_info(infos.add(), t, elem_types)  # written in place, not copied in
        else:
            infos.append(OnnxExporter.export_value_info_proto(t, do_type_check=False))
    if src.HasField("doc_string"):
        out.doc_string = src.doc_string
    elif graph.doc_string:
        out.doc_string = graph.doc_string
    out.metadata_props.extend(src.metadata_props)


def _initializers(constants: list[gs.Constant], original) -> list[onnx.TensorProto]:
    """Source initializers in source order (graphsurgeon drops unused ones), then new ones.

    ``constants`` are the graph's, in graphsurgeon's export order; one that still reads the source's
    TensorProto under its name is that TensorProto.
    """
    exported: list[tuple[str, onnx.TensorProto]] = []
    for t in constants:
        values = t._values
        if isinstance(values, LazyValues) and values.tensor.name == t.name:
            exported.append((t.name, values.tensor))
        elif isinstance(values, LazyValues):  # renamed: graphsurgeon would rename the source's TensorProto
            proto = onnx.TensorProto()
            proto.CopyFrom(values.tensor)
            proto.name = t.name
            exported.append((t.name, proto))
        else:
            exported.append((t.name, OnnxExporter.export_tensor_proto(t)))
    rank = {p.name: i for i, p in enumerate(original)}
    have = {name for name, _ in exported}
    items = exported + [(p.name, p) for p in original if p.name not in have]
    items.sort(key=lambda item: (0, rank[item[0]]) if item[0] in rank else (1, 0))
    return [proto for _, proto in items]


def _restored_value_infos(tensors: list[gs.Tensor], original) -> list[onnx.ValueInfoProto]:
    """Graph inputs/outputs as graphsurgeon exports them, except that those that kept their name and
    type are written as in the source, which carries what graphsurgeon drops (``metadata_props``,
    ``doc_string``)."""
    by_name = {vi.name: vi for vi in original}
    elem_types: dict[object, int] = {}
    out = []
    for t in tensors:
        vi = _value_info(t, elem_types)
        src = by_name.get(vi.name)
        out.append(src if src is not None and src.type == vi.type else vi)
    return out


def _value_info(t: gs.Tensor, elem_types: dict[object, int]) -> onnx.ValueInfoProto:
    """``OnnxExporter.export_value_info_proto(t, do_type_check=False)``; ``elem_types`` remembers
    the dtype conversions (see :func:`_fill_value_info`)."""
    if _plain(t):
        return _fill_value_info(onnx.ValueInfoProto(), t, elem_types)
    return OnnxExporter.export_value_info_proto(t, do_type_check=False)


def _plain(t: gs.Tensor) -> bool:
    """Whether graphsurgeon exports ``t``'s value_info with ``make_tensor_value_info`` (a typed tensor)."""
    return t.dtype is not None and (isinstance(t, gs.Constant) or t.type == "tensor_type")


def _fill_value_info(vi: onnx.ValueInfoProto, t: gs.Tensor, elem_types: dict[object, int]) -> onnx.ValueInfoProto:
    """Fill the empty ``vi`` as ``export_value_info_proto`` does for a :func:`_plain` tensor:
    ``onnx.helper.make_tensor_value_info(t.name, dtype_to_onnx(t.dtype), t.shape)``, step for step,
    but in place (its TypeProto is copied into the ValueInfoProto, and that into the graph) and with
    each dtype converted once (graphsurgeon's conversion takes ~7 µs a tensor)."""
    elem = elem_types.get(t.dtype)
    if elem is None:
        elem = elem_types[t.dtype] = dtype_to_onnx(t.dtype)
    vi.name = t.name
    tensor_type = vi.type.tensor_type
    tensor_type.elem_type = elem
    shape = t.shape
    if shape is not None:
        dims = tensor_type.shape.dim
        dims.extend([])  # as make_tensor_type_proto: a scalar gets an empty shape, not none
        for d in shape:
            dim = dims.add()
            if d is None:
                pass
            elif isinstance(d, int):
                dim.dim_value = d
            elif isinstance(d, str):
                dim.dim_param = d
            else:
                raise ValueError(f"Invalid item in shape: {d}. Needs to be of int or str.")
    return vi
