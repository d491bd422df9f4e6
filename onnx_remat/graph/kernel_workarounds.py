"""Rewrites around onnxruntime 1.19 kernels whose results depend on where tensors live.

onnxruntime-training 1.19's CPU ``ConvGrad`` (``orttraining/training_ops/cpu/nn/conv_grad.cc``)
computes the input gradient of a *grouped* convolution whose kernel is not 2-D (1-D: wav2vec 2.0's
and HuBERT's positional convolution, 16 groups; 3-D) one group at a time with ``Col2imNdPar``,
telling it the size of the whole image (all channels) while pointing it at one group's channels:
the zeroing that starts each group's image runs past the end of the output, over ``(groups - 1)``
groups' worth of whatever tensor lives after it. Which tensor that is depends on the allocation
plan, so the step's gradients depend on the node order (measured on a wav2vec 2.0 export with a
4-group positional convolution: the gradients of everything below it change when the nodes after
it are reordered, and match the plan with memory reuse off only by chance). The 2-D path
(``Col2imPar``) is correct.

:func:`fix_grouped_conv_grads` gives each such node the 2-D form: a unit spatial axis added to
its inputs (``Unsqueeze``, a view), ``ConvGrad`` with the 1-D attributes as ``[1, k]``, the axis
removed from its outputs (``Squeeze``). Same products and sums, no write past the output
(checked: the 2-D form of the original equals onnxruntime's result with memory reuse off, bit for
bit, and stays so under any node order). 3-D kernels are reported, not rewritten.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_remat.graph import tags
from onnx_remat.graph.conventions import MS_DOMAIN
from onnx_remat.graph.node_list import with_nodes

AXES_NAME = "onnx_remat/conv_grad_2d/axes"
WORKAROUND_NOTE = (
    "{n} grouped 1-D ConvGrad node(s) written in the 2-D form: onnxruntime 1.19's CPU kernel writes past its "
    "output for them, so the original's gradients depend on where its tensors live (compare checks against "
    "the original in the same form)"
)
_SUFFIX = "/conv_grad_2d"


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def grouped_conv_grads(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The ``com.microsoft::ConvGrad`` nodes with ``group > 1`` and a kernel that is not 2-D: those
    whose CPU kernel writes past its input gradient in onnxruntime 1.19 (module docstring)."""
    return [model.graph.node[k] for k in _grouped_positions(model)]


def _grouped_positions(model: onnx.ModelProto) -> list[int]:
    out = []
    for k, n in enumerate(model.graph.node):
        if n.op_type != "ConvGrad" or n.domain != MS_DOMAIN:
            continue
        attrs = _attrs(n)
        kernel = attrs.get("kernel_shape")
        if int(attrs.get("group", 1)) > 1 and kernel is not None and len(kernel) != 2 and n.output and n.output[0]:
            out.append(k)
    return out


def fix_grouped_conv_grads(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with every 1-D grouped ``ConvGrad`` in the 2-D form onnxruntime computes
    correctly, and the names of the nodes rewritten. The model comes back as it is (the same
    object) when there is none; otherwise a copy (the input is not changed)."""
    # positions, not id(): protobuf hands out a new wrapper object on each access
    targets = {k for k in _grouped_positions(model) if len(_attrs(model.graph.node[k]).get("kernel_shape", [])) == 1}
    if not targets:
        return model, []
    nodes: list[onnx.NodeProto] = []
    fixed: list[str] = []
    for k, n in enumerate(model.graph.node):
        if k not in targets:
            nodes.append(n)
            continue
        nodes.extend(_two_d(n))
        fixed.append(n.name)
    out = with_nodes(model, nodes)
    if not any(t.name == AXES_NAME for t in out.graph.initializer):
        out.graph.initializer.append(numpy_helper.from_array(np.array([2], dtype=np.int64), AXES_NAME))
    return out, fixed


def _two_d(node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """The nodes that stand in for 1-D ``ConvGrad`` ``node``: inputs ``dY [N, M, L]``, ``X [N, C, Lx]``,
    ``W [M, C/g, k]`` get a height of 1, and its outputs ``dX``, ``dW`` lose it again (``dB`` is
    the same in both forms)."""
    attrs = _attrs(node)
    base = node.name or f"ConvGrad/{node.output[0]}"
    doc = (
        f"onnx-remat: {base} in the 2-D form (onnxruntime 1.19's CPU ConvGrad writes past its output for "
        "grouped 1-D kernels)"
    )

    def tagged(n: onnx.NodeProto) -> onnx.NodeProto:
        n.doc_string = doc
        entry = n.metadata_props.add()
        entry.key, entry.value = tags.ROLE_KEY, tags.ROLE_WORKAROUND
        return n

    out: list[onnx.NodeProto] = []
    inputs = []
    for k, t in enumerate(node.input):
        if not t:
            inputs.append(t)
            continue
        raised = f"{t}{_SUFFIX}/{base}"
        out.append(tagged(helper.make_node("Unsqueeze", [t, AXES_NAME], [raised], name=f"{base}{_SUFFIX}/in{k}")))
        inputs.append(raised)
    pads = list(attrs.get("pads", [0, 0]))
    two_d: dict[str, Any] = {
        "kernel_shape": [1, int(attrs["kernel_shape"][0])],
        "strides": [1, int(attrs.get("strides", [1])[0])],
        "dilations": [1, int(attrs.get("dilations", [1])[0])],
        "pads": [0, int(pads[0]), 0, int(pads[1])],
        "group": int(attrs["group"]),
    }
    if "auto_pad" in attrs:
        value = attrs["auto_pad"]
        two_d["auto_pad"] = value.decode() if isinstance(value, bytes) else value
    outputs = [f"{o}{_SUFFIX}" if o and k < 2 else o for k, o in enumerate(node.output)]
    conv = helper.make_node("ConvGrad", inputs, outputs, name=f"{base}{_SUFFIX}", domain=MS_DOMAIN, **two_d)
    out.append(tagged(conv))
    for k, (o, raised) in enumerate(zip(node.output, outputs)):
        if o and k < 2:
            out.append(tagged(helper.make_node("Squeeze", [raised, AXES_NAME], [o], name=f"{base}{_SUFFIX}/out{k}")))
    return out
