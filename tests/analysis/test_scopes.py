"""Scope resolution (TorchScript names, dynamo metadata, eval model) and pattern matching."""

from __future__ import annotations

import pytest
from conftest import artifacts_dir

from onnx_remat.analysis.model import analyze_model
from onnx_remat.analysis.scopes import Scope, _matches, _metadata_chain, _name_chain
from onnx_remat.errors import RematError


@pytest.fixture(scope="module")
def analyses():
    return {name: analyze_model(artifacts_dir(name)) for name in ("blocks10", "blocks10_dynamo", "gpt", "resnet")}


@pytest.mark.parametrize(
    "name, chain",
    [
        ("/blocks.0/attn/MatMul", ["blocks.0", "blocks.0.attn"]),
        ("/blocks.0/drop/Dropout", ["blocks.0", "blocks.0.drop"]),
        ("/layers.0/layers.0.1/bn1/BatchNormalization", ["layers.0", "layers.0.1", "layers.0.1.bn1"]),
        ("/MatMul", []),
        ("onnx::Sub::2", []),
    ],
)
def test_torchscript_names(name, chain):
    assert [p for p, _ in _name_chain(name)] == chain


def test_dynamo_metadata():
    meta = {
        "pkg.torch.onnx.name_scopes": "['', 'blocks.0', 'blocks.0.drop', 'native_dropout']",
        "pkg.torch.onnx.class_hierarchy": (
            "['m.Net', 'm.Block', 'torch.nn.modules.dropout.Dropout', 'aten.native_dropout.default']"
        ),
    }
    assert _metadata_chain(meta) == [("blocks.0", "m.Block"), ("blocks.0.drop", "torch.nn.modules.dropout.Dropout")]
    assert _metadata_chain({"pkg.torch.onnx.name_scopes": "not a list"}) is None


@pytest.mark.parametrize(
    "pattern, path, cls, hit",
    [
        ("blocks.*", "blocks.0", None, True),
        ("blocks.*", "blocks.0.attn", None, False),
        ("blocks.**", "blocks.0.attn", None, True),
        ("encoder.layer.*.attention", "encoder.layer.11.attention", None, True),
        ("layer?", "layer1", None, True),
        ("blocks.1", "blocks.10", None, False),
        ("Block", "blocks.3", "models.blocks10.Block", True),
        ("*Attention", "blocks.0.attn", "models.gpt.CausalSelfAttention", True),
        ("Block", "blocks.3.drop", "torch.nn.modules.dropout.Dropout", False),
    ],
)
def test_pattern_matching(pattern, path, cls, hit):
    assert _matches(pattern, Scope(path=path, class_name=cls)) is hit


def test_torchscript_and_dynamo_exports_give_the_same_blocks(analyses):
    for name in ("blocks10", "blocks10_dynamo"):
        tree = analyses[name].scopes
        match = tree.match(["Block"])
        assert [s.path for s in match.scopes] == [f"blocks.{i}" for i in range(10)]
        assert tree.source == "eval_model.onnx metadata"
        assert [len(g) for g in tree.repeated_layers() if g[0].short_class == "Block"] == [10]


def test_nodes_renamed_by_onnxruntime_keep_their_scope(analyses):
    # gpt's GELU becomes com.microsoft Gelu in the training graph; found via its output name.
    tree = analyses["gpt"].scopes
    gelus = [n for n in analyses["gpt"].graph.forward_nodes if n.op == "Gelu"]
    assert gelus and all(tree.scope_of(n).path.startswith("blocks.") for n in gelus)
    bns = [n for n in analyses["resnet"].graph.forward_nodes if n.op == "BatchNormInternal"]
    assert bns and all(analyses["resnet"].scopes.scope_of(n) is not analyses["resnet"].scopes.root for n in bns)


def test_nested_matches_fold_into_the_outer_scope(analyses):
    match = analyses["gpt"].scopes.match(["blocks.*", "blocks.*.attn"])
    assert [s.path for s in match.scopes] == [f"blocks.{i}" for i in range(4)]
    assert [(inner.path, outer.path) for inner, outer in match.nested] == [
        (f"blocks.{i}.attn", f"blocks.{i}") for i in range(4)
    ]


def test_pattern_matching_nothing_names_the_closest_scopes(analyses):
    with pytest.raises(RematError, match=r"'Blok' matches no scope; closest: .*Block"):
        analyses["blocks10"].scopes.match(["Blok"])
    with pytest.raises(RematError, match=r"'block.0' matches no scope; closest: blocks\.0"):
        analyses["blocks10"].scopes.match(["block.0"])


@pytest.mark.parametrize("name", ["blocks10", "blocks10_dynamo", "gpt", "resnet", "fc5"])
def test_literal_patterns_are_looked_up_as_every_scope_would_be_compared(name):
    """A pattern without wildcards is looked up by path and class names; the hits, and their order,
    are those of comparing it with every scope."""
    tree = analyze_model(artifacts_dir(name)).scopes
    scopes = tree.scopes()
    patterns = {p for s in scopes for p in (s.path, s.short_class, s.class_name) if p}
    assert patterns
    for pattern in sorted(patterns):
        assert tree.match([pattern]).by_pattern[pattern] == [s for s in scopes if _matches(pattern, s)]
    every_path = [s.path for s in scopes]
    both = tree.match(every_path)
    assert both.by_pattern == {p: [s for s in scopes if _matches(p, s)] for p in every_path}
