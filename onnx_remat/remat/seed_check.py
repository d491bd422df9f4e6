"""How to check a ``dropout="seed"`` rewrite, whose loss and gradients differ from the original's by design.

A seed-mode rewrite (:mod:`onnx_remat.remat.random_ops`) gives recomputed Dropouts seeds of their
own, so its random stream is not onnxruntime's global one and nothing equals the original graph
bit for bit. What can be checked, and :func:`onnx_remat.runtime.compare.compare` does:

* :func:`seeded_reference`: the original graph with the same ``seed`` on the same Dropouts and
  nothing else changed. It draws the rewrite's masks without recomputing anything, so the
  rewrite's loss and gradients must equal *its* bit for bit (same inputs, same step);
* :func:`with_mask_outputs`: a copy of the rewrite that also outputs, for every seeded Dropout,
  the mask of the forward Dropout and the mask each redraw (clone, or the ``DropoutGrad`` turned
  into a seeded Dropout) draws, and the forward and recomputed outputs of a cloned Dropout. Run
  for a few steps, every pair must be equal in every step: the recompute draws what the forward
  pass drew. The copy serves this check only (its extra outputs keep tensors alive).

The rewrite records its mode and seeds in the model metadata ``onnx_remat.dropout``
(:mod:`onnx_remat.graph.tags`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import onnx
from onnx import helper

from onnx_remat.errors import RematError
from onnx_remat.graph import tags

CHECK_INFIX = "/remat_check/"


def dropout_metadata(model: onnx.ModelProto) -> dict | None:
    """The ``onnx_remat.dropout`` metadata of a rewritten model (None if absent or unreadable)."""
    for prop in model.metadata_props:
        if prop.key == tags.DROPOUT_KEY:
            try:
                data = json.loads(prop.value)
            except json.JSONDecodeError:
                return None
            return data if isinstance(data, dict) else None
    return None


def seeded_dropouts(model: onnx.ModelProto) -> dict[str, int]:
    """Dropout node name -> seed of a ``dropout="seed"`` rewrite; empty for any other model."""
    meta = dropout_metadata(model)
    if not meta or meta.get("mode") != "seed" or not isinstance(meta.get("seeds"), dict):
        return {}
    return {str(k): int(v) for k, v in meta["seeds"].items()}


def seeded_reference(model: onnx.ModelProto, seeds: dict[str, int]) -> onnx.ModelProto:
    """A copy of ``model`` (the original graph) whose Dropouts named in ``seeds`` have that seed.

    Raises a one-line RematError naming a Dropout ``model`` lacks (it is not the rewrite's original).
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    by_name = {n.name: n for n in out.graph.node if n.op_type == "Dropout" and n.domain in ("", "ai.onnx")}
    missing = [name for name in seeds if name not in by_name]
    if missing:
        raise RematError(
            f"A has no Dropout named {missing[0]!r}: it is not the graph B was rewritten from, so the seeded "
            "reference for B's dropout=seed rewrite cannot be built"
        )
    for name, seed in seeds.items():
        node = by_name[name]
        del node.attribute[:]  # a Dropout's only attribute is its seed
        node.attribute.append(helper.make_attribute("seed", int(seed)))
    return out


@dataclass
class MaskPair:
    """Two outputs of the check model that must be equal: ``forward`` (what the forward pass drew
    or computed) and ``recomputed`` (what a redraw gave)."""

    dropout: str
    what: str  # "mask" or "output"
    forward: str
    recomputed: str
    by: str  # the node that redrew it


def with_mask_outputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[MaskPair]]:
    """The check copy of a seed-mode rewrite (see the module docstring) and the pairs to compare."""
    from onnx_remat.analysis.sizes import TensorSizes

    seeds = seeded_dropouts(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    sizes = TensorSizes(model)
    extra: dict[str, int] = {}  # output name -> element type

    def mask_of(node: onnx.NodeProto) -> str:
        while len(node.output) < 2:
            node.output.append("")
        if not node.output[1]:
            node.output[1] = f"{node.name}{CHECK_INFIX}mask"
        extra[node.output[1]] = onnx.TensorProto.BOOL
        return node.output[1]

    forward: dict[str, onnx.NodeProto] = {}
    for node in graph.node:
        if node.name in seeds and node.op_type == "Dropout":
            forward[node.name] = node
    pairs: list[MaskPair] = []
    for node in graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        source = meta.get(tags.SOURCE_KEY)
        if node.op_type != "Dropout" or source not in forward or node is forward.get(node.name):
            continue
        fwd = forward[source]
        pairs.append(MaskPair(source, "mask", mask_of(fwd), mask_of(node), node.name))
        if meta.get(tags.ROLE_KEY) == tags.ROLE_CLONE and node.output[0]:
            for name in (fwd.output[0], node.output[0]):
                extra[name] = sizes.elem_type(fwd.input[0]) or onnx.TensorProto.FLOAT
            pairs.append(MaskPair(source, "output", fwd.output[0], node.output[0], node.name))
    have = {o.name for o in graph.output}
    for name, elem in extra.items():
        if name not in have:
            graph.output.append(helper.make_tensor_value_info(name, elem, None))
    return out, pairs
