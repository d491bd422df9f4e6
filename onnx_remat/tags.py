"""How onnx-remat marks the nodes it adds, so people (in Netron) and tools can tell them apart.

Every node the recompute rewrite adds carries:

* a name: clones are ``<original node name>/remat``, barriers ``remat_barrier/<segment>``;
  their output tensors are ``<original tensor>/remat`` and ``<gated tensor>/remat_gate/<segment>``;
* ``metadata_props``: ``onnx_remat.role`` (``clone`` or ``barrier``), ``onnx_remat.segment``
  (the segment label), and for clones ``onnx_remat.source`` (the original node's name);
* a ``doc_string`` saying in words what it recomputes.

onnxruntime keeps node names of nodes it does not fuse, but not metadata, in the optimized graph
it writes; so the runtime checks (which clones survived, when they ran) go by name.
The rewritten model also carries model-level metadata ``onnx_remat.plan`` (JSON: one entry per
segment) and ``onnx_remat.version``.
"""

from __future__ import annotations

ROLE_KEY = "onnx_remat.role"
SEGMENT_KEY = "onnx_remat.segment"
SOURCE_KEY = "onnx_remat.source"
PLAN_KEY = "onnx_remat.plan"
VERSION_KEY = "onnx_remat.version"

ROLE_CLONE = "clone"
ROLE_BARRIER = "barrier"

CLONE_SUFFIX = "/remat"
BARRIER_PREFIX = "remat_barrier/"
GATE_INFIX = "/remat_gate/"


def clone_name(original: str, op_type: str, index: int) -> str:
    """Name of the clone of node ``original`` (unnamed nodes get ``<op_type>_<index>``)."""
    return (original or f"{op_type}_{index}") + CLONE_SUFFIX


def clone_tensor_name(original: str) -> str:
    """Name of the recomputed copy of tensor ``original``."""
    return original + CLONE_SUFFIX


def barrier_name(segment: str) -> str:
    """Name of the barrier node of segment ``segment``."""
    return BARRIER_PREFIX + segment


def gate_tensor_name(original: str, segment: str) -> str:
    """Name of the barrier output that passes ``original`` through to segment ``segment``."""
    return original + GATE_INFIX + segment


def is_clone_name(name: str) -> bool:
    """True for a node name given by :func:`clone_name`."""
    return name.endswith(CLONE_SUFFIX)


def is_barrier_name(name: str) -> bool:
    """True for a node name given by :func:`barrier_name`."""
    return name.startswith(BARRIER_PREFIX)


def segment_of_name(name: str) -> str | None:
    """Segment label encoded in a barrier node name, else None."""
    return name[len(BARRIER_PREFIX):] if is_barrier_name(name) else None
