"""A model with another node list: the one copy that every order-writing pass makes.

onnxruntime stores no execution order in the file; its DEFAULT order follows the node list
(:mod:`onnx_remat.ortsim.order`), so the passes that order a graph (the memory schedule, random-op
pins) write a new node list and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx


def with_nodes(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto]) -> onnx.ModelProto:
    """A copy of ``model`` whose node list is ``nodes`` (``model`` is not changed)."""
    # Copy the whole model, then replace the node list. Copying all but the nodes instead (emptying
    # the input's node list for the copy, then refilling it) copies fewer nodes but is slower:
    # taking nodes out of a list their Python objects still point into copies each of them, and
    # refilling copies them again (measured on a 21k-node graph: 0.16 s against 0.09 s). It also
    # leaves ``model`` untouched throughout.
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out
