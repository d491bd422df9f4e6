"""Models broken inside, which onnxruntime refuses at load: every command that reads one stops
with a one-line error and writes nothing (they used to reach an internal error, or an exit-0
rewrite that onnxruntime refused later). Each mutant is first shown to be refused by onnxruntime
itself (graph optimizations off): the tool's verdict is checked against the runtime's."""

from __future__ import annotations

import shutil

import onnx
import pytest
from conftest import artifacts_dir, assert_one_line_error

from onnx_remat.ortsim.validity import check_initializer_data


def _reshape_shape_initializer(model: onnx.ModelProto) -> onnx.TensorProto:
    inits = {t.name: t for t in model.graph.initializer}
    node = next(n for n in model.graph.node if n.op_type == "Reshape" and n.input[1] in inits)
    return inits[node.input[1]]


def dims_not_matching_data(model: onnx.ModelProto) -> str:
    """The first failure class: an initializer's dims no longer match its data (was: internal
    error 'cannot reshape array of size 4 into shape (1,)')."""
    t = _reshape_shape_initializer(model)
    t.dims[:] = [1]
    return t.name


def shape_tensor_reshaped(model: onnx.ModelProto) -> str:
    """An initializer's dims changed with its data still matching ([4] -> [4, 1]): strict ONNX
    inference rejects the Reshape (its shape input is no longer 1-D), onnxruntime loads and runs it."""
    t = _reshape_shape_initializer(model)
    t.dims[:] = [t.dims[0], 1]
    return "Reshape"


def input_retyped_to_string(model: onnx.ModelProto) -> str:
    """A graph input retyped to tensor(string) (INVALID_GRAPH ... Type Error at load)."""
    model.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.STRING
    return "string"


def attribute_out_of_range(model: onnx.ModelProto) -> str:
    """An integer attribute beyond what shape inference accepts: a Gather's axis past its rank."""
    node = next(n for n in model.graph.node if n.op_type == "Gather")
    next(a for a in node.attribute if a.name == "axis").i = 7
    return "Gather"


def accumulation_buffer_retyped(model: onnx.ModelProto) -> str:
    """Found by the mutation fuzzer: an input only onnxruntime's own op reads (a gradient
    accumulation buffer, read by InPlaceAccumulatorV2) retyped; ONNX's inference skips that op."""
    readers = {i for n in model.graph.node if n.op_type == "InPlaceAccumulatorV2" for i in n.input}
    vi = next(v for v in model.graph.input if v.name in readers)
    vi.type.tensor_type.elem_type = onnx.TensorProto.INT8
    return "onnxruntime refuses to load it"


def runtime_op_attribute_out_of_range(model: onnx.ModelProto) -> str:
    """Found by the mutation fuzzer: an attribute of onnxruntime's own FusedMatMul out of range."""
    node = next(n for n in model.graph.node if n.op_type == "FusedMatMul")
    next(a for a in node.attribute if a.name == "transBatchB").i = 99
    return "onnxruntime refuses to load it"


def doc_string_not_utf8(model: onnx.ModelProto) -> str:
    """Found by the mutation fuzzer (a flipped byte): a node's doc string that is not UTF-8 reached
    the rewrite's model writer (internal error: UnicodeDecodeError)."""
    return "not valid UTF-8"


def stash_type_out_of_range(model: onnx.ModelProto) -> str:
    """Found by the mutation fuzzer: a LayerNormalization's stash_type set to 99; ONNX's C++
    inference raised a bare ValueError ("Invalid tensor data type 99."), an internal error."""
    node = next(n for n in model.graph.node if n.op_type == "LayerNormalization")
    next(a for a in node.attribute if a.name == "stash_type").i = 99
    return "Invalid tensor data type 99"


MUTATIONS = [
    stash_type_out_of_range,
    dims_not_matching_data,
    input_retyped_to_string,
    attribute_out_of_range,
    accumulation_buffer_retyped,
    runtime_op_attribute_out_of_range,
    doc_string_not_utf8,
]
# the example graph each mutation is made on (FusedMatMul: blocks10's batched matmul gradients)
GRAPH = {runtime_op_attribute_out_of_range: "blocks10", doc_string_not_utf8: "blocks10"}


def _ort_refuses(path) -> bool:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    except Exception:
        return True
    return False


@pytest.fixture(params=MUTATIONS, ids=lambda f: f.__name__)
def mutant(request, tmp_path):
    name = GRAPH.get(request.param, "gpt")
    art = tmp_path / name
    shutil.copytree(artifacts_dir(name), art)
    path = art / "training_model.onnx"
    model = onnx.load(str(path))
    named = request.param(model)
    data = model.SerializeToString()
    if request.param is doc_string_not_utf8:
        # protobuf will not write a str that is not UTF-8: change the bytes, as the fuzzer did
        doc = next(n.doc_string for n in model.graph.node if n.doc_string).encode()
        data = data.replace(doc, b"\x88" + doc[1:], 1)
    path.write_bytes(data)
    if request.param is not doc_string_not_utf8:  # onnxruntime loads that one: names are opaque to it
        assert _ort_refuses(path), "the mutant must be one onnxruntime refuses"
    return art, named


@pytest.mark.parametrize(
    "command",
    [
        ["apply", "--scope", "Block"],
        ["apply", "--budget", "50%"],
        ["estimate", "--scope", "Block"],
        ["schedule"],
        ["scopes"],
    ],
    ids=lambda c: " ".join(c),
)
def test_a_model_onnxruntime_refuses_gets_one_line_and_nothing_written(mutant, command, cli, tmp_path):
    art, named = mutant
    out = tmp_path / "out"
    args = [command[0], art, *command[1:]]
    if command[0] in ("apply", "schedule"):
        args += ["-o", out]
    proc = cli(*args)
    assert_one_line_error(proc, named)
    assert "internal error" not in proc.stderr
    assert not out.exists()


def test_a_shape_only_strict_inference_rejects_is_judged_by_onnxruntime(cli, tmp_path):
    """Where strict ONNX inference and onnxruntime disagree, onnxruntime's load decides: a graph it
    loads is not refused (a static check alone would have refused a valid graph)."""
    art = tmp_path / "gpt"
    shutil.copytree(artifacts_dir("gpt"), art)
    model = onnx.load(str(art / "training_model.onnx"))
    shape_tensor_reshaped(model)
    onnx.save(model, str(art / "training_model.onnx"))
    assert not _ort_refuses(art / "training_model.onnx")
    proc = cli("estimate", art, "--scope", "Block")
    assert proc.returncode == 0, proc.stderr


def test_initializer_data_is_checked_in_every_encoding():
    raw = onnx.numpy_helper.from_array(__import__("numpy").zeros(3, "float32"), "raw")
    check_initializer_data(_with(raw))
    typed = onnx.helper.make_tensor("typed", onnx.TensorProto.INT64, [2], [1, 2])
    check_initializer_data(_with(typed))
    for bad, why in [
        (_redimmed(typed, [3]), "need 3 values of int64, it holds 2"),
        (_redimmed(raw, [4]), "need 16 bytes of float, it holds 12"),
        (_redimmed(raw, [10**12]), "need 4,000,000,000,000 bytes"),
        (_redimmed(raw, [-3]), "negative"),
    ]:
        with pytest.raises(Exception, match=why):
            check_initializer_data(_with(bad))


def _redimmed(t: onnx.TensorProto, dims: list[int]) -> onnx.TensorProto:
    c = onnx.TensorProto()
    c.CopyFrom(t)
    c.dims[:] = dims
    return c


def _with(t: onnx.TensorProto) -> onnx.ModelProto:
    return onnx.helper.make_model(onnx.helper.make_graph([], "g", [], [], initializer=[t]))


@pytest.mark.parametrize(
    "command",
    [
        ["apply", "--scope", "FCBlock", "-o", "OUT"],
        ["apply", "--budget", "50%", "-o", "OUT"],
        ["estimate", "--scope", "FCBlock"],
        ["schedule", "-o", "OUT"],
        ["plan", "--budget", "50%"],
        ["report", "--scope", "FCBlock", "-o", "OUT.html"],
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_validity_is_judged_once_per_command(command, monkeypatch, tmp_path):
    """The whole-graph checks (strict inference, onnxruntime's load) cost seconds on a large graph:
    a command makes them once, on the model it reads, not again on what it derives."""
    from click.testing import CliRunner

    import onnx_remat.model_io as model_io
    import onnx_remat.ortsim.registry as registry
    from onnx_remat.cli.main import main

    calls = {"inference": 0, "onnxruntime": 0}

    def counted(name, real):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(registry, "check_types_and_shapes", counted("inference", registry.check_types_and_shapes))
    monkeypatch.setattr(model_io, "onnxruntime_load_error", counted("onnxruntime", model_io.onnxruntime_load_error))

    def start(path, nodes):  # onnxruntime's load in a child (where this process has not imported onnxruntime)
        pending = real_start(path, nodes)
        calls["onnxruntime"] += pending is not None
        return pending

    real_start = model_io.start_load_check
    monkeypatch.setattr(model_io, "start_load_check", start)
    out = str(tmp_path / "out")
    args = [command[0], str(artifacts_dir("fc5")), *(a.replace("OUT", out) for a in command[1:])]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert calls == {"inference": 1, "onnxruntime": 1}  # fc5's gradients are onnxruntime's own ops


def test_an_absurd_declared_dim_is_one_line_not_terabytes(cli, tmp_path):
    """Found by the mutation fuzzer's long run: a parameter input declared [10**12, ...] is loaded
    by onnxruntime (a declared shape is checked only when a run feeds it), but ONNX's data
    propagation tried to allocate terabytes for it (std::bad_alloc, or the machine's memory)."""
    art = tmp_path / "gpt"
    shutil.copytree(artifacts_dir("gpt"), art)
    model = onnx.load(str(art / "training_model.onnx"))
    weight = next(vi for vi in model.graph.input if vi.name.endswith("weight") and vi.type.tensor_type.shape.dim)
    weight.type.tensor_type.shape.dim[0].dim_value = 10**12
    onnx.save(model, str(art / "training_model.onnx"))
    for command in (["estimate", "--scope", "Block"], ["apply", "--scope", "Block", "-o", tmp_path / "out"]):
        proc = cli(command[0], art, *command[1:])
        assert_one_line_error(proc, weight.name)
        assert "larger than any device holds" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_declared_sizes():
    from onnx_remat.errors import RematError
    from onnx_remat.ortsim.validity import check_declared_sizes

    def graph(*dims):
        vi = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(dims))
        return onnx.helper.make_graph([], "g", [vi], [])

    check_declared_sizes(graph("batch", 1024, 1024))
    check_declared_sizes(graph(0, 3))
    with pytest.raises(RematError, match="negative dim"):
        check_declared_sizes(graph(-3, 2))
    with pytest.raises(RematError, match=r"'x' declares shape \['batch', 1000000000000\]"):
        check_declared_sizes(graph("batch", 10**12))


@pytest.mark.parametrize("command", ["measure", "compare"])
def test_a_tensor_name_not_utf8_gets_one_line_from_the_runtime_commands(command, cli, tmp_path):
    """Found by the mutation fuzzer's long run (seed 2031, mutant 350: a flipped byte in a tensor
    name of resnet_ts): ``measure`` and ``compare``, which leave validity to onnxruntime's load,
    read names first and failed on the bytes (internal error: TypeError)."""
    art = tmp_path / "fc5"
    shutil.copytree(artifacts_dir("fc5"), art)
    path = art / "training_model.onnx"
    model = onnx.load(str(path))
    name = next(t for t in model.graph.input if t.name.endswith("weight")).name.encode()
    data = model.SerializeToString()
    assert data.count(name) > 1
    path.write_bytes(data.replace(name, name[:1] + b"\x9e" + name[2:]))
    args = [art] if command == "measure" else [artifacts_dir("fc5"), art]
    proc = cli(command, *args, "--steps", "1")
    assert_one_line_error(proc, "not valid UTF-8")
    assert "internal error" not in proc.stderr
