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

This module is the one place that works around all of that: :class:`ModelGraph` keeps the
dropped per-node fields in a side table and :meth:`ModelGraph.to_model` puts them back; the
iterative :func:`onnx_remat.graph.toposort.stable_toposort` replaces graphsurgeon's toposort. A round
trip without edits reproduces the input model byte for byte (tests/test_gs_bridge.py).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from dataclasses import dataclass, field

import onnx
import onnx_graphsurgeon as gs


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while graphsurgeon builds or exports a large graph.

    Import/export create ~10 objects per node and nothing cyclic to collect; with the collector on,
    its full passes rescan the growing heap (measured: ~20% of import time on 40k nodes).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


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
        with _gc_paused():
            self.graph: gs.Graph = gs.import_onnx(model)
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

    def to_model(
        self, extra_opsets: dict[str, int] | None = None, metadata: dict[str, str] | None = None
    ) -> onnx.ModelProto:
        """Export the (edited) graph as a ModelProto that keeps the source model's fields.

        ``extra_opsets`` adds opset imports for domains the edits introduced (an existing
        import of the same domain is kept as it is); ``metadata`` adds or replaces model-level
        ``metadata_props``.
        """
        src = self._source
        with _gc_paused():
            model = gs.export_onnx(self.graph, do_type_check=False)
        out = onnx.ModelProto()
        out.CopyFrom(src)
        out.graph.CopyFrom(model.graph)

        for node, proto in zip(self.graph.nodes, out.graph.node):
            extras = self._extras.get(id(node))
            if extras is None:
                continue
            if extras.doc_string:
                proto.doc_string = extras.doc_string
            else:
                proto.ClearField("doc_string")
            del proto.metadata_props[:]
            for key, value in extras.metadata.items():
                proto.metadata_props.add(key=key, value=value)

        _restore_initializers(out.graph.initializer, src.graph.initializer)
        _restore_value_infos(out.graph.input, src.graph.input)
        _restore_value_infos(out.graph.output, src.graph.output)
        _merge_value_info(out.graph, src.graph)
        if src.graph.HasField("doc_string"):
            out.graph.doc_string = src.graph.doc_string
        out.graph.metadata_props.extend(src.graph.metadata_props)

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


def _restore_initializers(exported, original) -> None:
    """Source initializers in source order (graphsurgeon drops unused ones), then new ones."""
    rank = {t.name: i for i, t in enumerate(original)}
    have = {t.name for t in exported}
    items = list(exported) + [t for t in original if t.name not in have]
    items.sort(key=lambda t: (0, rank[t.name]) if t.name in rank else (1, 0))
    del exported[:]
    exported.extend(items)


def _restore_value_infos(exported, original) -> None:
    """Graph inputs/outputs that kept their name and type are written as in the source.

    The source entries carry what graphsurgeon drops (``metadata_props``, ``doc_string``).
    """
    by_name = {vi.name: vi for vi in original}
    for vi in exported:
        src = by_name.get(vi.name)
        if src is not None and src.type == vi.type:
            vi.CopyFrom(src)


def _merge_value_info(graph: onnx.GraphProto, original: onnx.GraphProto) -> None:
    """The source's value_info as it was (edits never delete tensors), then the new entries."""
    exported = {vi.name: vi for vi in graph.value_info}
    merged = list(original.value_info)
    seen = {vi.name for vi in merged}
    merged += [vi for name, vi in exported.items() if name not in seen]
    del graph.value_info[:]
    graph.value_info.extend(merged)
