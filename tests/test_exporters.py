"""Unit tests of onnx_remat.exporters on small modules (TorchScript and dynamo exports)."""

from __future__ import annotations

import ast
import io
import logging
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

torch = pytest.importorskip("torch")
nn = torch.nn

from onnx_remat.exporters import (
    CLASS_HIERARCHY_KEY,
    NAME_SCOPES_KEY,
    NAMESPACE_KEY,
    STACK_TRACE_KEY,
    add_gradient_outputs,
    annotate_scopes,
    fix_dynamo_training_export,
    fix_eval_model,
    trainable_parameter_names,
)

ort = pytest.importorskip("onnxruntime")


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        return self.drop(torch.relu(self.fc(x)))


class Outer(nn.Module):
    """ModuleList children, Sequential children (numeric names), nesting, norms, a frozen bias."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Inner(), Inner()])
        self.seq = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), Inner())
        self.nested = nn.ModuleList([nn.Sequential(Inner())])
        self.ln = nn.LayerNorm(8)
        self.bn = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 3)
        self.head.bias.requires_grad_(False)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        x = self.seq(x)
        x = self.nested[0](x)
        x = self.bn(self.ln(x))
        return self.head(x)


def _outer() -> Outer:
    torch.manual_seed(0)
    return Outer().train()


X = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
LABELS = np.array([0, 1, 2, 1], dtype=np.int64)


def _meta(node: onnx.NodeProto) -> dict[str, str]:
    return {p.key: p.value for p in node.metadata_props}


def _torchscript(module: nn.Module) -> onnx.ModelProto:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (X,),
            f,
            dynamo=False,
            opset_version=17,
            training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=False,
            input_names=["x"],
            output_names=["y"],
        )
    return onnx.load_from_string(f.getvalue())


@pytest.fixture(scope="module")
def ts_export():
    module = _outer()
    return _torchscript(module), module


@pytest.fixture(scope="module")
def dynamo_export():
    module = _outer()
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module,
            (X,),
            dynamo=True,
            opset_version=18,
            training=torch.onnx.TrainingMode.TRAINING,
            input_names=["x"],
            output_names=["y"],
            verbose=False,
        )
    return program.model_proto, module


def _generate(model: onnx.ModelProto, requires_grad: list[str], tmp_path) -> onnx.ModelProto:
    from onnxruntime.training import artifacts

    ort.set_default_logger_severity(3)
    artifacts.generate_artifacts(
        model,
        requires_grad=requires_grad,
        loss=artifacts.LossType.CrossEntropyLoss,
        artifact_directory=str(tmp_path),
    )
    return onnx.load(str(tmp_path / "training_model.onnx"))


# --- add_gradient_outputs -------------------------------------------------------------------


def _synthetic() -> onnx.ModelProto:
    f = TensorProto.FLOAT
    then_graph = helper.make_graph(
        [helper.make_node("Dropout", ["a_in"], ["t"], name="inner_drop")],
        "then",
        [],
        [helper.make_tensor_value_info("t", f, [2, 4])],
    )
    nodes = [
        helper.make_node("Dropout", ["x"], ["y"], name="drop"),
        helper.make_node("Dropout", ["x"], ["y2", "y2_own_mask"], name="drop_with_mask"),
        helper.make_node("LayerNormalization", ["y", "s", "b"], ["ln"], name="ln"),
        helper.make_node("MaxPool", ["ln4"], ["mp"], name="pool", kernel_shape=[2]),
        helper.make_node("Dropout", ["x"], ["z", ""], name="drop_empty_mask"),
        helper.make_node("Identity", ["x"], ["y_mask"], name="taken"),
        helper.make_node("If", ["cond"], ["a"], name="if", then_branch=then_graph, else_branch=then_graph),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, f, [2, 4]) for n in ("x", "a_in")]
        + [helper.make_tensor_value_info(n, f, [4]) for n in ("s", "b")]
        + [helper.make_tensor_value_info("ln4", f, [1, 1, 4])]
        + [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(n, f, [2, 4]) for n in ("ln", "z", "y_mask", "a", "y2")]
        + [helper.make_tensor_value_info("mp", f, [1, 1, 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_add_gradient_outputs_adds_optional_outputs():
    model = _synthetic()
    before = model.SerializeToString()
    fixed = add_gradient_outputs(model)
    assert model.SerializeToString() == before, "input model was changed"
    nodes = {n.name: n for n in fixed.graph.node}
    # "y_mask" is taken by another node's output: the mask gets a unique name
    assert list(nodes["drop"].output) == ["y", "y_mask_1"]
    assert list(nodes["drop_with_mask"].output) == ["y2", "y2_own_mask"]
    assert list(nodes["drop_empty_mask"].output) == ["z", "z_mask"]
    assert list(nodes["ln"].output) == ["ln", "ln_mean", "ln_inv_std_dev"]
    assert list(nodes["pool"].output) == ["mp"]  # MaxPool indices make onnxruntime's gradient wrong
    assert list(nodes["taken"].output) == ["y_mask"]
    inner = nodes["if"].attribute[0].g.node[0]
    assert list(inner.output) == ["t", "t_mask"]
    onnx.checker.check_model(fixed)


def test_add_gradient_outputs_needed_for_torchscript_layernorm(ts_export, tmp_path):
    model, module = ts_export
    ln = [n for n in model.graph.node if n.op_type == "LayerNormalization"]
    assert ln and all(len(n.output) == 1 for n in ln), "TorchScript writes LayerNormalization with Y only"
    requires_grad = trainable_parameter_names(model, module)
    (tmp_path / "bad").mkdir()
    with pytest.raises(RuntimeError, match="OutputDefs"):
        _generate(model, requires_grad, tmp_path / "bad")
    training = _generate(add_gradient_outputs(model), requires_grad, tmp_path)
    assert any(n.op_type == "LayerNormalizationGrad" for n in training.graph.node)


def _run_training(tmp_path, model, module, inputs, labels):
    """Loss and parameter gradients of one step of the training graph made from ``model``."""
    from onnxruntime.capi import _pybind_state as C

    params = trainable_parameter_names(model, module)
    training = _generate(model, params, tmp_path)
    state = C.load_checkpoint(str(tmp_path / "checkpoint"))
    for p in params:
        training.graph.output.append(helper.make_empty_tensor_value_info(f"{p}_grad"))
    feeds = {"x": inputs, "labels": labels, "lazy_reset_grad": np.array([True])}
    suffix = "_grad.accumulation.buffer"
    for inp in training.graph.input:
        if inp.name not in feeds:
            name = inp.name[: -len(suffix)] if inp.name.endswith(suffix) else inp.name
            value = state.get_parameter(name).data.numpy()
            feeds[inp.name] = np.zeros_like(value) if inp.name.endswith(suffix) else value
    sess = ort.InferenceSession(training.SerializeToString(), providers=["CPUExecutionProvider"])
    out = sess.run([training.graph.output[0].name, *(f"{p}_grad" for p in params)], feeds)
    return float(out[0]), dict(zip(params, out[1:]))


def test_maxpool_gradient_right_without_indices(tmp_path):
    """Why add_gradient_outputs leaves MaxPool alone: with Indices the gradient is wrong."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64, 3))
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    labels = torch.tensor([1, 2])
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (x,),
            f,
            dynamo=False,
            opset_version=17,
            input_names=["x"],
            output_names=["y"],
            training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=False,
        )
    model = add_gradient_outputs(onnx.load_from_string(f.getvalue()))
    assert [len(n.output) for n in model.graph.node if n.op_type == "MaxPool"] == [1]
    loss, grads = _run_training(tmp_path, model, module, x.numpy(), labels.numpy())
    ref = nn.functional.cross_entropy(module(x), labels)
    ref.backward()
    assert loss == pytest.approx(ref.item(), rel=1e-5)
    for name, p in module.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


# --- fix_eval_model -------------------------------------------------------------------------


def test_fix_eval_model_batchnorm(ts_export, tmp_path):
    """generate_artifacts' eval model of a training-mode BatchNorm does not load until fixed."""
    model, module = ts_export
    fixed = annotate_scopes(add_gradient_outputs(model), module)
    _generate(fixed, trainable_parameter_names(fixed, module), tmp_path)
    evalm = onnx.load(str(tmp_path / "eval_model.onnx"))
    bn = next(n for n in evalm.graph.node if n.op_type == "BatchNormalization")
    assert len(bn.output) == 3 and any(a.name == "training_mode" and a.i == 0 for a in bn.attribute)
    ort.set_default_logger_severity(3)
    with pytest.raises(Exception, match="should be 1 when Training_mode = False"):
        ort.InferenceSession(evalm.SerializeToString(), providers=["CPUExecutionProvider"])
    before = evalm.SerializeToString()
    repaired = fix_eval_model(evalm)
    assert evalm.SerializeToString() == before, "input model was changed"
    bn2 = next(n for n in repaired.graph.node if n.op_type == "BatchNormalization")
    assert list(bn2.output) == [bn.output[0]]
    assert {p.key: p.value for p in bn2.metadata_props} == {p.key: p.value for p in bn.metadata_props}
    sess = ort.InferenceSession(repaired.SerializeToString(), providers=["CPUExecutionProvider"])
    from onnxruntime.capi import _pybind_state as C

    state = C.load_checkpoint(str(tmp_path / "checkpoint"))
    feeds = {"x": X.numpy(), "labels": LABELS}
    for inp in repaired.graph.input:
        if inp.name not in feeds:
            feeds[inp.name] = state.get_parameter(inp.name).data.numpy()
    (loss,) = sess.run(None, feeds)
    assert np.isfinite(loss)
    # a model without such nodes comes back equal
    assert fix_eval_model(_synthetic()) == _synthetic()


# --- fix_dynamo_training_export -------------------------------------------------------------


def test_fix_dynamo_adds_dropout_masks_and_strips_stack_traces(dynamo_export):
    model, _ = dynamo_export
    before = model.SerializeToString()
    drops = [n for n in model.graph.node if n.op_type == "Dropout"]
    assert drops and all(len(n.output) == 1 for n in drops), "dynamo writes Dropout without mask"
    assert any(STACK_TRACE_KEY in _meta(n) for n in model.graph.node)
    fixed = fix_dynamo_training_export(model)
    assert model.SerializeToString() == before, "input model was changed"
    for node in fixed.graph.node:
        meta = _meta(node)
        assert STACK_TRACE_KEY not in meta
        assert NAME_SCOPES_KEY in meta and CLASS_HIERARCHY_KEY in meta
        if node.op_type == "Dropout":
            assert len(node.output) == 2 and node.output[1] == f"{node.output[0]}_mask"
        if node.op_type == "LayerNormalization":
            assert len(node.output) == 3
    names = [o for n in fixed.graph.node for o in n.output]
    assert len(names) == len(set(names))
    onnx.checker.check_model(fixed)


def test_fix_dynamo_then_generate_artifacts(dynamo_export, tmp_path):
    model, module = dynamo_export
    requires_grad = trainable_parameter_names(model, module)
    (tmp_path / "bad").mkdir()
    with pytest.raises(RuntimeError, match="OutputDefs"):
        _generate(model, requires_grad, tmp_path / "bad")
    training = _generate(fix_dynamo_training_export(model), requires_grad, tmp_path)
    ops = {n.op_type for n in training.graph.node}
    assert {"DropoutGrad", "LayerNormalizationGrad", "BatchNormalizationGrad"} <= ops
    outputs = [o.name for o in training.graph.output]
    assert [f"{p}_grad.accumulation.out" for p in requires_grad] == outputs[1:]


# --- trainable_parameter_names --------------------------------------------------------------


def test_trainable_parameter_names_torchscript(ts_export):
    model, module = ts_export
    inits = {i.name for i in model.graph.initializer}
    assert {"bn.running_mean", "bn.running_var", "head.bias"} <= inits
    names = trainable_parameter_names(model, module, strict=True)
    expected = [n for n, p in module.named_parameters() if p.requires_grad]
    assert sorted(names) == sorted(expected)
    assert "head.bias" not in names  # frozen
    assert not any("running" in n for n in names)  # buffers


def test_trainable_parameter_names_excludes_dynamo_constants(dynamo_export):
    model, module = dynamo_export
    constants = [i.name for i in model.graph.initializer if i.name.startswith("val_")]
    assert constants, "expected the dynamo exporter to turn constants into initializers"
    names = trainable_parameter_names(model, module)
    assert not set(names) & set(constants)
    assert set(names) <= {n for n, p in module.named_parameters() if p.requires_grad}
    # order follows the initializers
    order = [i.name for i in model.graph.initializer if i.name in set(names)]
    assert names == order


def test_trainable_parameter_names_strict_reports_merged_parameters(dynamo_export):
    """dynamo's optimizer merges equal small initializers: bn.weight (ones) into ln.weight."""
    model, module = dynamo_export
    inits = {i.name for i in model.graph.initializer}
    missing = [n for n, p in module.named_parameters() if p.requires_grad and n not in inits]
    if not missing:
        pytest.skip("this torch/onnxscript did not merge equal initializers")
    with pytest.raises(ValueError, match="no initializer"):
        trainable_parameter_names(model, module, strict=True)


# --- annotate_scopes ------------------------------------------------------------------------


def test_annotate_scopes_lists(ts_export):
    model, module = ts_export
    before = model.SerializeToString()
    annotated = annotate_scopes(model, module)
    assert model.SerializeToString() == before, "input model was changed"
    nodes = {n.name: n for n in annotated.graph.node}
    q = f"{__name__}"
    lin, seq = "torch.nn.modules.linear.Linear", "torch.nn.modules.container.Sequential"
    drop = "torch.nn.modules.dropout.Dropout"
    expected = {
        # ModuleList child: one TorchScript component with a dot
        "/layers.0/drop/Dropout": (
            ["", "layers.0", "layers.0.drop", "Dropout"],
            [f"{q}.Outer", f"{q}.Inner", drop, "Dropout"],
        ),
        "/layers.1/Relu": (["", "layers.1", "Relu"], [f"{q}.Outer", f"{q}.Inner", "Relu"]),
        # Sequential children: TorchScript writes their full path (seq/seq.0)
        "/seq/seq.0/Gemm": (["", "seq", "seq.0", "Gemm"], [f"{q}.Outer", seq, lin, "Gemm"]),
        "/seq/seq.2/fc/Gemm": (
            ["", "seq", "seq.2", "seq.2.fc", "Gemm"],
            [f"{q}.Outer", seq, f"{q}.Inner", lin, "Gemm"],
        ),
        # Sequential inside a ModuleList
        "/nested.0/nested.0.0/drop/Dropout": (
            ["", "nested.0", "nested.0.0", "nested.0.0.drop", "Dropout"],
            [f"{q}.Outer", seq, f"{q}.Inner", drop, "Dropout"],
        ),
        "/head/Gemm": (["", "head", "Gemm"], [f"{q}.Outer", lin, "Gemm"]),
    }
    for name, (scopes, classes) in expected.items():
        meta = _meta(nodes[name])
        assert ast.literal_eval(meta[NAME_SCOPES_KEY]) == scopes, name
        assert ast.literal_eval(meta[CLASS_HIERARCHY_KEY]) == classes, name
        assert meta[NAME_SCOPES_KEY] == repr(scopes)  # Python list literal, like dynamo
        assert meta[NAMESPACE_KEY] == "/".join(f"{s}: {c}" for s, c in zip(scopes, classes))
    for node in annotated.graph.node:
        if node.name.startswith("/"):
            assert NAME_SCOPES_KEY in _meta(node), node.name


def test_annotate_scopes_matches_dynamo(ts_export, dynamo_export):
    """The scope paths and classes (all but the op element) are those the dynamo exporter writes."""

    def scope_set(model):
        out = set()
        for node in model.graph.node:
            meta = _meta(node)
            if NAME_SCOPES_KEY in meta:
                scopes = ast.literal_eval(meta[NAME_SCOPES_KEY])[:-1]
                classes = ast.literal_eval(meta[CLASS_HIERARCHY_KEY])[:-1]
                out.add(tuple(zip(scopes, classes)))
        return out

    ts_model, ts_module = ts_export
    dyn_model, _ = dynamo_export
    assert scope_set(annotate_scopes(ts_model, ts_module)) == scope_set(dyn_model)


def test_annotate_scopes_skips_unknown_and_keeps_existing(ts_export):
    model, module = ts_export
    model = onnx.ModelProto.FromString(model.SerializeToString())
    relu = next(n for n in model.graph.node if n.name == "/layers.1/Relu")
    relu.metadata_props.add(key=NAME_SCOPES_KEY, value="['', 'mine']")
    odd = next(n for n in model.graph.node if n.name == "/head/Gemm")
    odd.name = "/no_such_module/Gemm"
    annotated = annotate_scopes(model, module)
    nodes = {n.name: n for n in annotated.graph.node}
    assert _meta(nodes["/layers.1/Relu"])[NAME_SCOPES_KEY] == "['', 'mine']"
    assert not nodes["/no_such_module/Gemm"].metadata_props
    again = annotate_scopes(model, module, overwrite=True)
    relu2 = next(n for n in again.graph.node if n.name == "/layers.1/Relu")
    assert _meta(relu2)[NAME_SCOPES_KEY] == "['', 'layers.1', 'Relu']"
    assert sum(p.key == NAME_SCOPES_KEY for p in relu2.metadata_props) == 1


def test_annotated_eval_model_keeps_scopes_and_training_model_keeps_names(ts_export, tmp_path):
    model, module = ts_export
    fixed = annotate_scopes(add_gradient_outputs(model), module)
    training = _generate(fixed, trainable_parameter_names(fixed, module), tmp_path)
    evalm = onnx.load(str(tmp_path / "eval_model.onnx"))
    scoped = {n.name for n in evalm.graph.node if NAME_SCOPES_KEY in _meta(n)}
    assert scoped
    assert not any(n.metadata_props for n in training.graph.node)
    training_names = {n.name for n in training.graph.node}
    # every annotated forward node that is not a Constant and not BatchNormalization (which
    # onnxruntime replaces by <name>_BatchNormInternal) keeps its name in the training graph
    for node in evalm.graph.node:
        if node.name in scoped and node.op_type not in ("Constant", "BatchNormalization"):
            assert node.name in training_names, node.name
    assert "/bn/BatchNormalization_BatchNormInternal" in training_names


def test_sequential_children_named_beside_the_sequential_resolve():
    """TorchScript names a Sequential's children relative to the Sequential's parent (ConvNeXt's
    ``/stages.0/layers/layers.0/dwconv/Conv`` is module ``stages.0.layers.0.dwconv``)."""
    from onnx_remat.exporters import resolve_module_paths

    modules = dict.fromkeys(["stages", "stages.0", "stages.0.layers", "stages.0.layers.0", "stages.0.layers.0.dwconv"])
    parts = ["stages.0", "layers", "layers.0", "dwconv"]
    assert resolve_module_paths(parts, modules) == [
        "stages.0",
        "stages.0.layers",
        "stages.0.layers.0",
        "stages.0.layers.0.dwconv",
    ]
    assert resolve_module_paths(["stages.0", "layers", "nothing"], modules) is None


def test_a_grandchild_called_directly_resolves_below_the_running_path():
    """Hugging Face's OPTForCausalLM.forward calls ``self.model.decoder(...)``: TorchScript names
    the decoder's scope ``decoder`` right under the caller's (``/model/decoder/layers.0/...``), for
    module ``model.model.decoder.layers.0``. The one module below the running path whose name
    ends with the component, at the least depth, is taken; two at that depth are not."""
    from onnx_remat.exporters import module_path_ends, resolve_module_paths

    names = ["model", "model.model", "model.model.decoder", "model.model.decoder.layers"]
    names += ["model.model.decoder.layers.0", "model.model.decoder.layers.0.fc1", "model.lm_head"]
    modules = dict.fromkeys(names)
    parts = ["model", "decoder", "layers.0", "fc1"]
    want = ["model", "model.model.decoder", "model.model.decoder.layers.0", "model.model.decoder.layers.0.fc1"]
    assert resolve_module_paths(parts, modules) == want
    assert resolve_module_paths(parts, modules, ends=module_path_ends(modules)) == want
    assert resolve_module_paths(["model", "encoder"], modules) is None  # no such module below
    twice = dict.fromkeys([*names, "model.other", "model.other.decoder"])  # two decoders at depth 2
    assert resolve_module_paths(parts, twice) is None
    assert resolve_module_paths(["lm_head"], modules) == ["model.lm_head"]  # from the root too


def test_an_opt_decoder_export_names_its_layer_class():
    """OPT (Hugging Face) calls its decoder past OPTModel: every node of a decoder layer is still
    annotated with the layer's module path and class, so ``--scope OPTDecoderLayer`` finds the
    layers (found by a sweep over architectures the corpus lacks)."""
    pytest.importorskip("transformers")
    from models.corpus import _hf
    from onnx_remat.exporters import export_for_training

    build = _hf(
        "OPTForCausalLM",
        "OPTConfig",
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=2,
        ffn_dim=64,
        vocab_size=64,
        max_position_embeddings=16,
        word_embed_proj_dim=32,
    )
    module = build(("input_ids",))
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    model = export_for_training(module, (ids,), input_names=("input_ids",))
    layer_nodes = [n for n in model.graph.node if n.name.startswith("/model/decoder/layers.")]
    assert layer_nodes
    for node in layer_nodes:
        meta = {p.key: p.value for p in node.metadata_props}
        assert NAME_SCOPES_KEY in meta, node.name
        scopes, classes = ast.literal_eval(meta[NAME_SCOPES_KEY]), ast.literal_eval(meta[CLASS_HIERARCHY_KEY])
        k = next(i for i, s in enumerate(scopes) if s.startswith("model.model.decoder.layers."))
        assert classes[k].endswith(".OPTDecoderLayer") and scopes[k].count(".") == 4, (scopes, classes)
