"""A model with another node list: the one copy that every order-writing pass makes.

onnxruntime stores no execution order in the file; its DEFAULT order follows the node list
(:mod:`onnx_remat.ortsim.order`), so the passes that order a graph (the memory schedule, random-op
pins) write a new node list and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from onnx_remat.graph.proto_copy import copy_except


def with_nodes(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto]) -> onnx.ModelProto:
    """A copy of ``model`` whose node list is ``nodes`` (``model`` is not changed)."""
    # Everything but the node list is copied, then the nodes once each: a copy of the whole model
    # whose node list is then replaced copies every node twice (copy_except's docstring).
    out = copy_except(model, "graph")
    copy_except(model.graph, "node", into=out.graph)
    out.graph.node.extend(nodes)
    return out
