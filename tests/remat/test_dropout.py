"""Dropout masks at one bit per element, or none: packing, planning and the rewrite (issue 11).

The runtime checks (bit-identical replay, masks drawn again step after step) are in
tests/runtime/test_dropout_runtime.py.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from conftest import MiB, artifacts_dir

from onnx_remat import apply
from onnx_remat.analysis.model import analyze_model
from onnx_remat.errors import RematError
from onnx_remat.graph import tags
from onnx_remat.remat import mask_packing
from onnx_remat.remat.apply import plan
from onnx_remat.remat.random_ops import dropout_seeds
from onnx_remat.remat.seed_check import dropout_metadata, seeded_dropouts, seeded_reference, with_mask_outputs

ort = pytest.importorskip("onnxruntime")


def _roundtrip_model(declared, opset: int) -> onnx.ModelProto:
    mask = gs.Variable("m", dtype=np.bool_, shape=declared)
    constants: dict = {}
    packed = mask_packing.pack(mask, declared, "remat_pack/d", constants)
    out = gs.Variable("m/remat", dtype=np.bool_, shape=declared)
    steps = mask_packing.unpack(
        packed.packed, packed.extra, mask_packing.static_shape(declared), out, "remat_unpack/s/d", constants
    )
    graph = gs.Graph(nodes=packed.nodes + steps, inputs=[mask], outputs=[packed.packed, out], opset=opset)
    model = gs.export_onnx(graph)
    model.ir_version = 8
    return model


@pytest.mark.parametrize("opset", [13, 14, 17, 18])
@pytest.mark.parametrize(
    "shape, declared",
    [
        ((8, 16, 128, 128), (8, 16, 128, 128)),  # blocks10's masks
        ((3, 5, 7), (3, 5, 7)),  # 105 elements: not a multiple of 8, padded
        ((13,), (13,)),
        ((3, 5, 7), ("batch", 5, "seq")),  # size known only at run time
    ],
)
def test_pack_and_unpack_are_bit_exact_on_onnxruntime_cpu(shape, declared, opset):
    """The ops run on onnxruntime's CPU kernels at the graph's opset, with and without its
    optimizer, and give numpy's packbits (little bit order) and the mask back."""
    model = _roundtrip_model(declared, opset)
    ops = {n.op_type for n in model.graph.node}
    allowed = {"Reshape", "Cast", "MatMulInteger", "Gather", "Concat", "Slice", "Shape", "Size", "Mod", "Sub", "Pad"}
    assert ops <= allowed
    rng = np.random.default_rng(opset)
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        for _ in range(3):
            x = rng.random(shape) < 0.7
            packed, back = sess.run(None, {"m": x})
            assert packed.dtype == np.uint8
            assert np.array_equal(packed.reshape(-1), np.packbits(x.reshape(-1), bitorder="little"))
            assert back.dtype == np.bool_ and back.shape == x.shape and np.array_equal(back, x)


def test_packed_size_is_one_bit_per_element_padded():
    assert [mask_packing.packed_nbytes(n) for n in (1, 8, 9, 105, 2 * MiB)] == [1, 1, 2, 14, MiB // 4]
    assert mask_packing.can_pack((3, 5, 7), 10) and not mask_packing.can_pack(("batch", 5), 12)
    assert mask_packing.can_pack(("batch", 5), 13) and not mask_packing.can_pack((8,), 9)


@pytest.fixture(scope="module")
def blocks10():
    return analyze_model(artifacts_dir("blocks10"))


def test_packed_plan_releases_the_masks_and_stores_bits(blocks10):
    byte = plan(blocks10, scopes="Block", dropout="byte")
    packed = plan(blocks10, scopes="Block")  # the default
    assert packed.dropout == "packed"
    seg, old = packed.segments[3], byte.segments[3]
    mask = "/blocks.3/drop/Dropout_output_1"
    assert mask in [t.name for t in seg.targets] and mask not in [t.name for t in seg.kept]
    assert [t.name for t in seg.masks] == [mask] and seg.mask_storage == {mask: 256 * 1024}
    # The 2 MiB mask is released and 256 KiB of bits are stored instead.
    assert seg.released_bytes == old.released_bytes + 2 * MiB - 256 * 1024
    # blocks.9 is recomputed first, right after the forward pass: its mask stays bytes.
    last = packed.segments[9]
    assert last.mask_storage == {"/blocks.9/drop/Dropout_output_1": 2 * MiB}
    assert any("/blocks.9/drop/Dropout" in n and "one byte per element" in n for n in packed.notes)
    assert packed.mask_bytes == 9 * 256 * 1024 + 2 * MiB
    assert byte.mask_bytes == 9 * 2 * MiB  # block 0's dropout output is not stored, nor replayed


def test_seed_plan_stores_no_mask(blocks10):
    p = plan(blocks10, scopes="Block", dropout="seed")
    assert p.mask_bytes == 0
    assert all(seg.mask_bytes == 0 and len(seg.masks) == 1 for seg in p.segments)
    byte = plan(blocks10, scopes="Block", dropout="byte")
    assert p.released_bytes == byte.released_bytes + 10 * 2 * MiB


def test_an_unknown_dropout_mode_is_a_one_line_error():
    with pytest.raises(RematError, match=r"^dropout must be one of packed, seed, byte, got 'bits'$"):
        apply(artifacts_dir("blocks10"), scopes="Block", dropout="bits")


@pytest.fixture(scope="module")
def packed():
    return apply(artifacts_dir("blocks10"), scopes="Block", check_peak=False)


def test_the_mask_is_packed_right_after_the_dropout(packed):
    nodes = list(packed.model.graph.node)
    names = [n.name for n in nodes]
    dropout = "/blocks.4/drop/Dropout"
    at = names.index(dropout)
    steps = [n for n in nodes[at + 1 : at + 7]]
    assert [n.op_type for n in steps] == ["Reshape", "Cast", "MatMulInteger", "Cast", "Reshape", "PassThrough"]
    assert all(tags.is_pack_name(n.name) for n in steps)
    assert all({p.key: p.value for p in n.metadata_props}[tags.ROLE_KEY] == tags.ROLE_PACK for n in steps)
    anchor = steps[-1]
    # The Dropout's forward reader waits for the packing; the byte mask has no other reader.
    out, mask = nodes[at].output
    assert list(anchor.input) == [out, mask + "/remat_packed"]
    readers = [n.name for n in nodes if mask in n.input]
    assert readers == [steps[0].name]
    assert [n.name for n in nodes if out in n.input] == [anchor.name]
    # onnxruntime's DEFAULT order (emulated) runs the packing right after the Dropout.
    order = _order(packed)
    i = order.index(dropout)
    assert order[i + 1 : i + 7] == [n.name for n in steps]


def _order(result):
    from onnx_remat.estimate import estimate_rewritten

    return list(estimate_rewritten(result.analysis, result.model).order_names)


def test_segments_unpack_behind_their_barrier(packed):
    nodes = {n.name: n for n in packed.model.graph.node}
    producer = {o: n for n in packed.model.graph.node for o in n.output}
    seg = next(s for s in packed.rewrite.segments if s.label == "blocks.4")
    unpack = [nodes[n] for n in seg.unpacked]
    assert [n.op_type for n in unpack] == ["Cast", "Gather", "Reshape"]
    assert producer[unpack[0].input[0]].name == seg.barrier
    # The original DropoutGrad and the replay read the unpacked mask.
    copy = unpack[-1].output[0]
    assert copy == "/blocks.4/drop/Dropout_output_1/remat"
    assert sorted(n.name for n in packed.model.graph.node if copy in n.input) == [
        "/blocks.4/drop/Dropout/remat",
        "/blocks.4/drop/Dropout_Grad/DropoutGrad_0",
    ]
    meta = dropout_metadata(packed.model)
    assert meta["mode"] == "packed" and len(meta["packed"]) == 9 and meta["seeds"] == {}


def test_packed_summary_counts_mask_bytes_per_segment(packed):
    summary = packed.summary()
    assert summary["dropout"] == "packed" and summary["masks"] == 10
    assert summary["mask_bytes"] == 9 * 256 * 1024 + 2 * MiB
    seg = next(s for s in summary["segments"] if s["label"] == "blocks.4")
    assert seg["masks"] == ["/blocks.4/drop/Dropout_output_1"] and seg["mask_bytes"] == 256 * 1024
    assert seg["unpack_nodes"] == 3


@pytest.fixture(scope="module")
def seeded():
    return apply(artifacts_dir("blocks10"), scopes="Block", dropout="seed", check_peak=False)


def test_seed_rewrite_redraws_instead_of_storing(seeded):
    nodes = list(seeded.model.graph.node)
    seeds = seeded_dropouts(seeded.model)
    assert seeds == seeded.rewrite.dropout_seeds and len(seeds) == 10
    assert len(set(seeds.values())) == 10
    for node in nodes:
        if node.name in seeds:  # the forward Dropout: seeded, and its mask is no output any more
            assert [a.i for a in node.attribute if a.name == "seed"] == [seeds[node.name]]
            assert len(node.output) == 1
    # Each DropoutGrad became a Dropout of the gradient with the same seed (name and doc kept).
    redraws = [n for n in nodes if {p.key: p.value for p in n.metadata_props}.get(tags.ROLE_KEY) == tags.ROLE_REDRAW]
    assert len(redraws) == 10 and all(n.op_type == "Dropout" and n.domain == "" for n in redraws)
    grad = next(n for n in redraws if n.name == "/blocks.4/drop/Dropout_Grad/DropoutGrad_0")
    assert grad.input[0] == "/blocks.4/drop/Dropout_output_0_grad" and len(grad.output) == 1
    assert [a.i for a in grad.attribute] == [seeds["/blocks.4/drop/Dropout"]]
    assert grad.doc_string.startswith("Backward pass")
    assert not any(n.op_type == "DropoutGrad" for n in nodes)
    # The replay of the output is a Dropout with the same seed too, without a mask output.
    clone = next(n for n in nodes if n.name == "/blocks.4/drop/Dropout/remat")
    assert clone.op_type == "Dropout" and len(clone.output) == 1
    assert [a.i for a in clone.attribute] == [seeds["/blocks.4/drop/Dropout"]]
    assert seeded.mask_bytes == 0
    assert any("not bit-identical to it by design" in n for n in seeded.notes)


def test_seeds_are_spread_apart():
    """A seeded CPU kernel draws from seed, seed + 1, ... (one per step): streams must not meet."""
    seeds = sorted(dropout_seeds([f"d{i}" for i in range(24)]).values())
    assert min(b - a for a, b in itertools.pairwise(seeds)) > 80_000_000
    assert seeds[-1] < 2**31 - 1
    assert dropout_seeds(["a", "b"], base=5) != dropout_seeds(["a", "b"])


def test_seed_check_models(seeded):
    original = onnx.load(str(artifacts_dir("blocks10") / "training_model.onnx"))
    seeds = seeded_dropouts(seeded.model)
    reference = seeded_reference(original, seeds)
    changed = [n.name for n, m in zip(original.graph.node, reference.graph.node) if n != m]
    assert sorted(changed) == sorted(seeds)  # the same graph but the seeds
    check, pairs = with_mask_outputs(seeded.model)
    names = {o.name for o in check.graph.output}
    assert len(pairs) == 10 + 9 + 9  # every redraw's mask; each clone's mask and output
    assert all(p.forward in names and p.recomputed in names for p in pairs)
    with pytest.raises(RematError, match="A has no Dropout named"):
        seeded_reference(original, {"nope": 1})


def test_masks_stay_bytes_where_packing_would_raise_the_estimated_peak():
    """--recompute-outputs stages unpack every earlier block's masks again: there bytes are lower."""
    staged = apply(artifacts_dir("blocks10"), scopes="Block", recompute_outputs=True)
    assert staged.dropout == "byte" and not staged.rewrite.packed_masks
    assert any("packing them raises the estimated planned peak" in n for n in staged.notes)
    per_block = apply(artifacts_dir("blocks10"), scopes="Block")
    assert per_block.dropout == "packed" and len(per_block.rewrite.packed_masks) == 9
