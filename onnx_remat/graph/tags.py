"""How onnx-remat marks the nodes it adds, so people (in Netron) and tools can tell them apart.

Every node the recompute rewrite adds carries:

* a name: clones are ``<original node name>/remat``, barriers ``remat_barrier/<segment>``,
  fusion fences ``remat_fence/<tensor>``, random-order pins ``remat_order/<random node>``,
  gradient accumulation steps ``remat_accumulate/<parameter>/<k>`` (and their anchors
  ``.../anchor``, see :mod:`onnx_remat.scheduling.accumulate`), the gates through which a gradient's
  readers wait for shared weights' partial gradients ``remat_partial/<gradient>``
  (:mod:`onnx_remat.scheduling.partials`; output ``<gradient>/remat_partial``); their
  output tensors are ``<original tensor>/remat``, ``<gated tensor>/remat_gate/<segment>``,
  ``<tensor>/remat_fence`` and ``<tensor>/remat_order/<random node>``. The nodes that pack a
  dropout mask to bits in the forward pass are ``remat_pack/<Dropout node>/<step>`` (the packed
  tensor ``<mask>/remat_packed``), those unpacking it for a segment
  ``remat_unpack/<segment>/<Dropout node>/<step>`` (the mask they give is the recomputed copy
  ``<mask>/remat``).
  A node cloned again for another segment (the stages of ``--recompute-outputs``) gets
  ``<original>@<k>/remat`` for its k-th copy;
* ``metadata_props``: ``onnx_remat.role`` (``clone``, ``barrier``, ``fence``, ``pin``,
  ``accumulate``, ``partial_gate``, ``pack``, ``unpack``, or ``redraw`` on a gradient node the rewrite changed in
  place, see :mod:`onnx_remat.remat.random_ops`), ``onnx_remat.segment`` (the segment label), and for clones
  ``onnx_remat.source`` (the original node's name);
* a ``doc_string`` saying in words what it recomputes.

onnxruntime keeps node names of nodes it does not fuse, but not metadata, in the optimized graph
it writes; so the runtime checks (which clones survived, when they ran) go by name.
The rewritten model also carries model-level metadata ``onnx_remat.plan`` (JSON: one entry per
segment), ``onnx_remat.dropout`` (JSON: ``{"mode": "packed" | "seed" | "byte", "seeds": {Dropout
node: seed}, "packed": [mask, ...]}``, how dropout masks are kept; with ``seed`` the random
stream differs from the original's by design) and ``onnx_remat.version``.
"""

from __future__ import annotations

ROLE_KEY = "onnx_remat.role"
SEGMENT_KEY = "onnx_remat.segment"
SOURCE_KEY = "onnx_remat.source"
PLAN_KEY = "onnx_remat.plan"
DROPOUT_KEY = "onnx_remat.dropout"
VERSION_KEY = "onnx_remat.version"

ROLE_CLONE = "clone"
ROLE_BARRIER = "barrier"
ROLE_FENCE = "fence"
ROLE_PIN = "pin"
ROLE_ACCUMULATE = "accumulate"
ROLE_PACK = "pack"
ROLE_UNPACK = "unpack"
ROLE_REDRAW = "redraw"  # a DropoutGrad turned into a seeded Dropout (dropout="seed"); keeps its name
ROLE_PARTIAL_GATE = "partial_gate"  # readers of a gradient wait for a shared weight's partial (scheduling/partials.py)
ROLE_WORKAROUND = "workaround"  # a kernel's node in a form onnxruntime computes correctly (graph/kernel_workarounds.py)

CLONE_SUFFIX = "/remat"
BARRIER_PREFIX = "remat_barrier/"
GATE_INFIX = "/remat_gate/"
FENCE_PREFIX = "remat_fence/"
FENCE_SUFFIX = "/remat_fence"
PIN_PREFIX = "remat_order/"
PIN_INFIX = "/remat_order/"
ACCUMULATE_PREFIX = "remat_accumulate/"
ACCUMULATE_INFIX = "/remat_accumulate/"
PARTIAL_GATE_PREFIX = "remat_partial/"
PARTIAL_GATE_INFIX = "/remat_partial"
PACK_PREFIX = "remat_pack/"
UNPACK_PREFIX = "remat_unpack/"


def _copy(base: str, copy: int) -> str:
    return base if copy == 1 else f"{base}@{copy}"


def clone_name(original: str, op_type: str, index: int, copy: int = 1) -> str:
    """Name of the ``copy``-th clone of node ``original`` (unnamed nodes: ``<op_type>_<index>``)."""
    return _copy(original or f"{op_type}_{index}", copy) + CLONE_SUFFIX


def clone_tensor_name(original: str, copy: int = 1) -> str:
    """Name of the ``copy``-th recomputed copy of tensor ``original``."""
    return _copy(original, copy) + CLONE_SUFFIX


def original_name(name: str) -> str:
    """The node or tensor a clone name was made from (``name`` itself if it is no clone name)."""
    if not name.endswith(CLONE_SUFFIX):
        return name
    base = name[: -len(CLONE_SUFFIX)]
    head, sep, copy = base.rpartition("@")
    return head if sep and copy.isdigit() else base


def barrier_name(segment: str) -> str:
    """Name of the barrier node of segment ``segment``."""
    return BARRIER_PREFIX + segment


def gate_tensor_name(original: str, segment: str) -> str:
    """Name of the barrier output that passes ``original`` through to segment ``segment``."""
    return original + GATE_INFIX + segment


def fence_name(tensor: str) -> str:
    """Name of the fusion fence that passes ``tensor`` to its last forward reader."""
    return FENCE_PREFIX + tensor


def fence_tensor_name(tensor: str) -> str:
    """Name of the fence's output."""
    return tensor + FENCE_SUFFIX


def is_fence_name(name: str) -> bool:
    """True for a node name given by :func:`fence_name`."""
    return name.startswith(FENCE_PREFIX)


def pin_name(node: str) -> str:
    """Name of the PassThrough that makes random op ``node`` wait for the one before it."""
    return PIN_PREFIX + node


def pin_tensor_name(tensor: str, node: str) -> str:
    """Name of the pin's output that passes ``tensor`` to random op ``node``."""
    return tensor + PIN_INFIX + node


def is_pin_name(name: str) -> bool:
    """True for a node name given by :func:`pin_name`."""
    return name.startswith(PIN_PREFIX)


def accumulate_name(parameter: str, step: int) -> str:
    """Name of the ``step``-th node that accumulates a partial gradient of ``parameter`` in place."""
    return f"{ACCUMULATE_PREFIX}{parameter}/{step}"


def accumulate_tensor_name(tensor: str, step: int) -> str:
    """Name of the tensor that ``tensor`` (a gradient buffer or partial) holds after ``step``."""
    return f"{tensor}{ACCUMULATE_INFIX}{step}"


def is_accumulate_name(name: str) -> bool:
    """True for a node name given by :func:`accumulate_name` (or its anchor)."""
    return name.startswith(ACCUMULATE_PREFIX)


def partial_gate_name(tensor: str) -> str:
    """Name of the PassThrough through which the other readers of gradient ``tensor`` wait for the
    partial gradients of shared weights made from it (:mod:`onnx_remat.scheduling.partials`)."""
    return PARTIAL_GATE_PREFIX + tensor


def partial_gate_tensor_name(tensor: str) -> str:
    """Name of that PassThrough's output that passes ``tensor`` on."""
    return tensor + PARTIAL_GATE_INFIX


def is_partial_gate_name(name: str) -> bool:
    """True for a node name given by :func:`partial_gate_name`."""
    return name.startswith(PARTIAL_GATE_PREFIX)


def pack_name(node: str) -> str:
    """Prefix of the names of the nodes packing the mask of Dropout ``node``."""
    return PACK_PREFIX + node


def unpack_name(segment: str, node: str) -> str:
    """Prefix of the names of the nodes unpacking the mask of Dropout ``node`` for ``segment``."""
    return f"{UNPACK_PREFIX}{segment}/{node}"


def is_pack_name(name: str) -> bool:
    """True for a node name starting with :func:`pack_name`."""
    return name.startswith(PACK_PREFIX)


def is_unpack_name(name: str) -> bool:
    """True for a node name starting with :func:`unpack_name`."""
    return name.startswith(UNPACK_PREFIX)


def is_recompute_name(name: str) -> bool:
    """True for the nodes that run when a segment is recomputed: clones, barriers, mask unpacking."""
    return is_clone_name(name) or is_barrier_name(name) or is_unpack_name(name)


def is_clone_name(name: str) -> bool:
    """True for a node name given by :func:`clone_name`."""
    return name.endswith(CLONE_SUFFIX)


def is_barrier_name(name: str) -> bool:
    """True for a node name given by :func:`barrier_name`."""
    return name.startswith(BARRIER_PREFIX)


def segment_of_name(name: str) -> str | None:
    """Segment label encoded in a barrier node name, else None."""
    return name[len(BARRIER_PREFIX) :] if is_barrier_name(name) else None


def is_added_name(name: str) -> bool:
    """True for the name of any node the rewrite adds (clone, barrier, fence, pin, mask packing)."""
    return (
        is_clone_name(name)
        or is_barrier_name(name)
        or is_fence_name(name)
        or is_pin_name(name)
        or is_partial_gate_name(name)
        or is_pack_name(name)
        or is_unpack_name(name)
    )
