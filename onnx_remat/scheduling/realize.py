"""Write an execution order into a model's node list, which is all onnxruntime's DEFAULT order reads.

Input: an ``onnx.ModelProto`` and ranks for its leaves; output: a new ModelProto (the input is not
changed) whose node list onnxruntime turns into the wanted order.

onnxruntime 1.19 stores no order in the file: its DEFAULT order is a reverse depth-first walk from
the graph's leaves (nodes no other node reads from), highest node index first
(:mod:`onnx_remat.ortsim.order`). Leaves can go anywhere after their producers, so moving them to
the end of the node list, in the order their cones should run (the first one last), changes the
order of the backward pass without touching anything else: :func:`place_leaves`. The rest of the
list keeps its relative order, so each leaf's cone runs as it did before.

Forward random ops (``Dropout``, ...) draw from one global generator: a new order of independent
random ops gives each a different mask. :func:`pin_random_order` makes each wait for the one before
it in a given order, through a zero-copy ``com.microsoft::PassThrough`` on its data input (as the
recompute rewrite does, :mod:`onnx_remat.remat.rewrite`), and sorts the list again, stably.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import onnx
from onnx import helper

from onnx_remat.graph import tags
from onnx_remat.graph.conventions import MS_DOMAIN, RANDOM_OPS
from onnx_remat.graph.toposort import index_order


def model_leaves(model: onnx.ModelProto) -> list[int]:
    """Positions of the nodes none of whose outputs another node reads."""
    read = {t for node in model.graph.node for t in node.input if t}
    return [k for k, node in enumerate(model.graph.node) if not any(o in read for o in node.output if o)]


def with_nodes(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto]) -> onnx.ModelProto:
    """A copy of ``model`` whose node list is ``nodes``."""
    out = onnx.ModelProto()
    graph = model.graph
    # Copy everything but the nodes once, then the nodes in their new order.
    saved = list(graph.node)
    del graph.node[:]
    try:
        out.CopyFrom(model)
    finally:
        graph.node.extend(saved)
    out.graph.node.extend(nodes)
    return out


def place_leaves(model: onnx.ModelProto, rank: Mapping[str, float]) -> onnx.ModelProto:
    """``model`` with its leaves moved to the end of the node list, highest ``rank`` first.

    ``rank`` maps leaf node names to when their cone should run (lower: earlier); the lowest
    rank ends up last in the list, where onnxruntime's DEFAULT order starts. Leaves without a
    rank go first (their cones run last), in their current order. Unnamed leaves keep their place.
    """
    nodes = list(model.graph.node)
    movable = [k for k in model_leaves(model) if nodes[k].name]
    moving = set(movable)
    unranked = float("inf")
    tail = sorted(movable, key=lambda k: (-rank.get(nodes[k].name, unranked), k))
    rest = [n for k, n in enumerate(nodes) if k not in moving]
    return with_nodes(model, rest + [nodes[k] for k in tail])


def random_ops(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The model's random ops that draw from onnxruntime's global generator: those with a data
    input and no ``seed`` attribute (a seeded kernel has a generator of its own, so its place in
    the order does not change what it draws: dropout="seed" rewrites)."""
    return [
        n
        for n in model.graph.node
        if n.op_type in RANDOM_OPS and n.input and n.input[0] and not any(a.name == "seed" for a in n.attribute)
    ]


def pin_random_order(model: onnx.ModelProto, order: Sequence[str]) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with every random op after the first waiting for the one before it in ``order``
    (node names; random ops not named keep their relative order after the named ones).

    Returns the new model and the names of the pins added. A pin is a ``PassThrough`` of the
    random op's data input and of the previous op's last output (its mask, stored for the
    backward pass anyway), so nothing lives longer than it did. The node list is then sorted
    stably (:func:`~onnx_remat.graph.toposort.index_order`).
    """
    randoms = random_ops(model)
    if len(randoms) < 2:
        return model, []
    where = {name: k for k, name in enumerate(order)}
    position = {id(n): k for k, n in enumerate(randoms)}
    randoms.sort(key=lambda n: (where.get(n.name, len(where)), position[id(n)]))
    nodes = [onnx.NodeProto() for _ in model.graph.node]
    index = {}
    for k, (copy, node) in enumerate(zip(nodes, model.graph.node)):
        copy.CopyFrom(node)
        index[id(node)] = k
    producer = {o: n.name for n in nodes for o in n.output if o}
    before: dict[int, onnx.NodeProto] = {}  # position of a random op -> its pin
    added: list[onnx.NodeProto] = []
    pins: list[str] = []
    for prev, node in itertools.pairwise(randoms):
        target = nodes[index[id(node)]]
        if tags.is_pin_name(producer.get(target.input[0], "")):
            continue  # it waits already (the recompute rewrite pinned it)
        wait_for = prev.output[-1] if prev.output[-1] else prev.output[0]
        data = target.input[0]
        name = tags.pin_name(target.name or target.op_type)
        passed = tags.pin_tensor_name(data, target.name)
        pin = helper.make_node(
            "PassThrough",
            [data, wait_for],
            [passed, tags.pin_tensor_name(wait_for, target.name)],
            name=name,
            domain=MS_DOMAIN,
            doc_string=(
                f"onnx-remat: {target.name or target.op_type} waits for {prev.name or prev.op_type} (random ops keep "
                "the original graph's order, so each draws the same numbers)"
            ),
        )
        entry = pin.metadata_props.add()
        entry.key, entry.value = tags.ROLE_KEY, tags.ROLE_PIN
        target.input[0] = passed
        before[index[id(node)]] = pin
        added.append(pin)
        pins.append(name)
    if not added:
        return model, []
    # Each pin goes right before its random op, then the list is sorted stably: a random op that
    # came before the one it now waits for moves down, the rest keeps its place.
    every = [m for k, n in enumerate(nodes) for m in ((before[k], n) if k in before else (n,))]
    order_ = index_order([list(n.input) for n in every], [list(n.output) for n in every])
    if len(order_) != len(every):
        raise RuntimeError("pinning the random ops in that order makes a cycle: the data orders them otherwise")
    return with_nodes(model, [every[k] for k in order_]), pins
