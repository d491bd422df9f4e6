"""Random ops keep their draw order: which of them a rewrite reorders, and the pins that order them.

onnxruntime's random ops (``Dropout`` in training mode, ``RandomNormal``, ...) draw from one global
generator, so what each draws depends on how many draws ran before it. A rewrite that changes the
node list (clones, fences, a new schedule) changes onnxruntime's DEFAULT order, and with it,
possibly, the order of independent random ops (seen: BART's decoder embedding dropout running
before the encoder's; GPT-NeoX's attention and MLP dropouts, siblings off one input).

* :func:`random_ops`: the model's random ops that draw from the global generator;
* :func:`flipped_pairs`: the consecutive pairs of a wanted order that an observed order runs the
  other way round;
* :func:`pin_random_order`: a copy of the model in which each random op of the given pairs waits,
  through a zero-copy ``com.microsoft::PassThrough`` on its data input, for the one before it. The
  node list is then sorted again, stably (:func:`~onnx_remat.graph.toposort.index_order`), so it is
  topological whatever the arrangement: pins between sibling branches, random ops whose run order
  differs from their node-list order, random ops outside any rewrite.

Which pairs need a pin is the caller's question, answered by emulating the rewritten graph's order
(:func:`onnx_remat.ortsim.emulation.keep_random_order`): a rewrite that leaves the draw order as it
was gets no pin.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import onnx
from onnx import helper

from onnx_remat.graph import tags
from onnx_remat.graph.conventions import MS_DOMAIN, RANDOM_OPS
from onnx_remat.graph.node_list import with_nodes
from onnx_remat.graph.toposort import index_order


def random_ops(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The model's random ops that draw from onnxruntime's global generator, in node-list order:
    those with a data input and no ``seed`` attribute (a seeded kernel has a generator of its own,
    so its place in the order does not change what it draws: dropout="seed" rewrites)."""
    return [
        n
        for n in model.graph.node
        if n.op_type in RANDOM_OPS and n.input and n.input[0] and not any(a.name == "seed" for a in n.attribute)
    ]


def flipped_pairs(wanted: Sequence[str], observed: Sequence[str]) -> list[tuple[str, str]]:
    """Consecutive pairs ``(a, b)`` of ``wanted`` that ``observed`` runs as ``b`` before ``a``.

    Only names in both lists count; the result is empty when ``observed`` keeps their order.
    """
    where = {name: k for k, name in enumerate(observed)}
    present = [name for name in wanted if name in where]
    return [(a, b) for a, b in itertools.pairwise(present) if where[b] < where[a]]


def _stored_output(node: onnx.NodeProto, by_name: dict[str, onnx.NodeProto]) -> str:
    """The output of random op ``node`` that a pin waits for: one that is stored for the backward
    pass anyway, so the pin makes nothing live longer. That is the mask (``Dropout``'s last
    output), or, where the recompute rewrite packs the mask (its byte form is freed right after
    the packing), the packed bytes as the packing's ``PassThrough`` passes them on."""
    anchor = by_name.get(f"{tags.pack_name(node.name)}/wait") if node.name else None
    if anchor is not None and len(anchor.output) > 1 and anchor.output[1]:
        return anchor.output[1]
    return node.output[-1] if node.output[-1] else node.output[0]


def pin_random_order(
    model: onnx.ModelProto, order: Sequence[str], *, pairs: Iterable[tuple[str, str]] | None = None
) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with random ops waiting for the one before them in ``order`` (node names; random
    ops not named keep their relative order after the named ones).

    ``pairs``: pin only these ``(before, after)`` pairs of consecutive random ops (default: every
    consecutive pair). Returns the new model (the input is not changed) and the names of the pins
    added. A random op that waits already (an earlier pin) is left as it is. A pin is a
    ``PassThrough`` of the random op's data input and of the previous op's stored output
    (:func:`_stored_output`). The node list is then sorted stably. Raises ``RuntimeError`` if the
    data orders two of the random ops the other way (a cycle).
    """
    randoms = random_ops(model)
    if len(randoms) < 2:
        return model, []
    where = {name: k for k, name in enumerate(order)}
    position = {id(n): k for k, n in enumerate(randoms)}
    randoms.sort(key=lambda n: (where.get(n.name, len(where)), position[id(n)]))
    wanted = None if pairs is None else set(pairs)
    nodes = [onnx.NodeProto() for _ in model.graph.node]
    index = {}
    for k, (copy, node) in enumerate(zip(nodes, model.graph.node)):
        copy.CopyFrom(node)
        index[id(node)] = k
    producer = {o: n.name for n in nodes for o in n.output if o}
    by_name = {n.name: n for n in nodes if n.name}
    before: dict[int, onnx.NodeProto] = {}  # position of a random op -> its pin
    pins: list[str] = []
    for prev, node in itertools.pairwise(randoms):
        if wanted is not None and (prev.name, node.name) not in wanted:
            continue
        target = nodes[index[id(node)]]
        if tags.is_pin_name(producer.get(target.input[0], "")):
            continue  # it waits already
        wait_for = _stored_output(prev, by_name)
        data = target.input[0]
        name = tags.pin_name(target.name or target.op_type)
        pin = helper.make_node(
            "PassThrough",
            [data, wait_for],
            # PassThrough needs an output per input (an omitted one crashes onnxruntime's kernel).
            [tags.pin_tensor_name(data, target.name), tags.pin_tensor_name(wait_for, target.name)],
            name=name,
            domain=MS_DOMAIN,
            doc_string=(
                f"onnx-remat: {target.name or target.op_type} waits for {prev.name or prev.op_type} (random ops keep "
                "the original graph's order, so each draws the same numbers)"
            ),
        )
        entry = pin.metadata_props.add()
        entry.key, entry.value = tags.ROLE_KEY, tags.ROLE_PIN
        target.input[0] = pin.output[0]
        before[index[id(node)]] = pin
        pins.append(name)
    if not pins:
        return model, []
    # Each pin goes right before its random op, then the list is sorted stably: a random op that
    # came before the one it now waits for moves down (with what reads it), the rest keeps its place.
    every = [m for k, n in enumerate(nodes) for m in ((before[k], n) if k in before else (n,))]
    sorted_ = index_order([list(n.input) for n in every], [list(n.output) for n in every])
    if len(sorted_) != len(every):
        raise RuntimeError("pinning the random ops in that order makes a cycle: the data orders them otherwise")
    return with_nodes(model, [every[k] for k in sorted_]), pins
