"""Loading and safe writing of models and artifacts directories."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest
from conftest import artifacts_dir

from onnx_remat import apply
from onnx_remat.errors import RematError
from onnx_remat.model_io import load_model, save_model, write_artifacts


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "empty file"),
        (b"hello, this is not a model", "not an ONNX model, or truncated"),
    ],
)
def test_bad_files(tmp_path, content, message):
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    with pytest.raises(RematError, match=message):
        load_model(path)


def test_truncated_file(tmp_path):
    data = (artifacts_dir("blocks10") / "training_model.onnx").read_bytes()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(RematError, match=r"cut.onnx: (not an ONNX model, or truncated|invalid ONNX model)"):
        load_model(path)


def test_missing_and_directory_without_model(tmp_path):
    with pytest.raises(RematError, match="no such file"):
        load_model(tmp_path / "nope.onnx")
    with pytest.raises(RematError, match="a directory without training_model.onnx"):
        load_model(tmp_path)


def test_save_refuses_to_overwrite(tmp_path):
    model = onnx.load(str(artifacts_dir("fc5") / "training_model.onnx"))
    out = save_model(model, tmp_path / "m.onnx")
    before = out.read_bytes()
    onnx.save_model(model, str(tmp_path / "by_onnx.onnx"))  # what onnx itself writes
    assert (tmp_path / "by_onnx.onnx").read_bytes() == before
    (tmp_path / "by_onnx.onnx").unlink()
    with pytest.raises(RematError, match="already exists; give --force"):
        save_model(model, out)
    for force in (False, True):  # an input is never written, --force or not
        with pytest.raises(RematError, match="this is an input"):
            save_model(model, out, inputs=(out,), force=force)
    assert out.read_bytes() == before
    save_model(model, out, force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]  # no temporary left behind


def test_external_data_round_trip(tmp_path):
    import numpy as np
    from onnx import numpy_helper

    src = artifacts_dir("fc5") / "training_model.onnx"
    model = onnx.load(str(src))
    # Training graphs keep parameters as inputs; add a large constant so there is data to externalize.
    model.graph.initializer.append(numpy_helper.from_array(np.zeros((256, 256), np.float32), "unused_table"))
    onnx.save_model(
        model, str(tmp_path / "ext.onnx"), save_as_external_data=True, location="ext.onnx.data", size_threshold=1024
    )
    assert (tmp_path / "ext.onnx.data").exists()
    loaded = load_model(tmp_path / "ext.onnx")
    assert loaded.external_data
    # Alone, without eval_model.onnx beside it, the graph has no class names: match paths.
    result = apply(loaded, scopes="runfunc*")
    (tmp_path / "out").mkdir()
    out = result.save(tmp_path / "out" / "r.onnx")
    assert (tmp_path / "out" / "r.onnx.data").exists()
    reread = load_model(out)
    assert len(reread.model.graph.node) == len(result.model.graph.node)
    table = next(t for t in reread.model.graph.initializer if t.name == "unused_table")
    assert numpy_helper.to_array(table).shape == (256, 256)


def test_artifacts_directory_is_written_whole(tmp_path):
    result = apply(artifacts_dir("fc5"), scopes="FCBlock")
    out = result.save(tmp_path / "fc5_remat")
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoint",
        "eval_model.onnx",
        "optimizer_model.onnx",
        "training_model.onnx",
    ]
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask  # a normal directory, not mkdtemp's 0700
    for name in ("checkpoint", "eval_model.onnx", "optimizer_model.onnx"):
        assert (out / name).read_bytes() == (artifacts_dir("fc5") / name).read_bytes()
    with pytest.raises(RematError, match="already exists"):
        result.save(out)
    write_artifacts(artifacts_dir("fc5"), out, result.model, force=True)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # temporaries cleaned up


def test_default_output_paths(tmp_path):
    """In the current directory, never beside the input (models/artifacts/ is scanned by tests and git)."""
    assert apply(artifacts_dir("fc5"), scopes="FCBlock").default_output() == Path("fc5_remat")
    model_file = tmp_path / "model.onnx"
    model_file.write_bytes((artifacts_dir("fc5") / "training_model.onnx").read_bytes())
    assert apply(model_file, scopes="runfunc*").default_output() == Path("model.remat.onnx")
    os.remove(model_file)


# -- the one writer: exclusive, atomic, never over an input, rolled back on failure ------------------


def test_write_file_is_exclusive_and_never_over_an_input(tmp_path):
    from onnx_remat.errors import UsageError
    from onnx_remat.model_io import output_session, write_file

    out = write_file(tmp_path / "a.json", "1")
    with pytest.raises(RematError, match="already exists; give --force"):
        write_file(out, "2")
    assert write_file(out, "3", force=True).read_text() == "3"
    with output_session({"MODEL": out}), pytest.raises(UsageError, match="this is the model"):
        write_file(out, "4", force=True)
    assert out.read_text() == "3"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_a_failed_command_takes_back_what_it_wrote(tmp_path):
    from onnx_remat.model_io import output_session, write_file

    (tmp_path / "kept.json").write_text("old")
    with pytest.raises(RuntimeError), output_session():
        write_file(tmp_path / "new.json", "x")
        write_file(tmp_path / "kept.json", "replaced", force=True)
        raise RuntimeError("the command failed after writing")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.json"]  # created: removed; replaced: stays
    assert (tmp_path / "kept.json").read_text() == "replaced"


def test_claims_are_checked_before_any_work(tmp_path):
    from onnx_remat.errors import UsageError
    from onnx_remat.model_io import output_session

    (tmp_path / "M").mkdir()
    with output_session({"MODEL": tmp_path / "M"}) as outs:
        outs.claim(tmp_path / "r", "-o", is_dir=True)
        with pytest.raises(UsageError, match="given as -o and as --json"):
            outs.claim(tmp_path / "r", "--json")
        with pytest.raises(UsageError, match="inside the model's folder"):
            outs.claim(tmp_path / "M" / "x.json", "--json")
        with pytest.raises(RematError, match="no such directory"):
            outs.claim(tmp_path / "nowhere" / "x.json", "--json")
        assert outs.claim(None, "--json") is None and outs.claim("-", "--json") is None


def test_external_data_file_is_an_output_too(tmp_path):
    from onnx import numpy_helper

    model = onnx.load(str(artifacts_dir("fc5") / "training_model.onnx"))
    import numpy as np

    model.graph.initializer.append(numpy_helper.from_array(np.zeros((64, 64), np.float32), "table"))
    (tmp_path / "m.onnx.data").write_text("not ours")
    with pytest.raises(RematError, match=r"m.onnx.data: already exists"):
        save_model(model, tmp_path / "m.onnx", external_data=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx.data"]
    save_model(model, tmp_path / "m.onnx", external_data=True, force=True)
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "m.onnx.data").stat().st_mode & 0o777 == 0o666 & ~umask
    assert load_model(tmp_path / "m.onnx").external_data


def test_force_replaces_only_an_artifacts_directory(tmp_path):
    result = apply(artifacts_dir("fc5"), scopes="FCBlock")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(RematError, match="not an artifacts directory"):
        result.save(mine, force=True)
    assert (mine / "notes.txt").read_text() == "keep me"
    with pytest.raises(RematError, match="inside the input folder"):
        write_artifacts(artifacts_dir("fc5"), artifacts_dir("fc5") / "sub", result.model)


def test_critical_holds_a_signal_until_the_block_ends():
    import signal

    from onnx_remat.interrupts import Interrupted, critical, install

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    install()
    try:
        done = []
        with pytest.raises(Interrupted) as caught, critical():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs between bytecodes; it must only note the signal
                done.append(1)
            done.append("finished")
        assert done[-1] == "finished" and caught.value.exit_code == 143 and caught.value.word == "terminated"
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def test_all_tensors_are_onnxs_own_list():
    """model_io's one-walk tensor list is onnx's ``_get_all_tensors`` (same tensors, same order):
    initializers with subgraphs', attribute tensors, local functions' (whose subgraphs'
    initializers onnx leaves out), and fields set against the attribute's declared type."""
    from onnx import helper
    from onnx.external_data_helper import _get_all_tensors

    from onnx_remat.model_io import _all_tensors

    def tensor(name: str) -> onnx.TensorProto:
        return helper.make_tensor(name, onnx.TensorProto.FLOAT, [1], [1.0])

    sub = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=tensor("in_sub"))],
        "sub",
        [],
        [helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [1])],
        initializer=[tensor("sub_init")],
    )
    branch = helper.make_node("If", ["cond"], ["o"], then_branch=sub, else_branch=sub)
    odd = helper.make_node("Relu", ["x"], ["r"])
    odd.attribute.add(name="k", type=onnx.AttributeProto.INT, i=1).t.CopyFrom(tensor("typed_int_holding_t"))
    function = helper.make_function(
        "local",
        "F",
        ["cond"],
        ["o"],
        [branch, helper.make_node("Constant", [], ["k"], value_floats=[1.0], **{})],
        [helper.make_opsetid("", 17)],
    )
    graph = helper.make_graph(
        [branch, odd, helper.make_node("F", ["cond"], ["o2"], domain="local")],
        "g",
        [helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("o", onnx.TensorProto.FLOAT, [1])],
        initializer=[tensor("init")],
    )
    model = helper.make_model(graph, functions=[function])
    ours = [t.name for t in _all_tensors(model)]
    assert ours == [t.name for t in _get_all_tensors(model)]
    assert ours[:3] == ["init", "sub_init", "sub_init"] and "typed_int_holding_t" in ours
    for name in ("blocks10", "gpt"):
        shipped = onnx.load(str(artifacts_dir(name) / "training_model.onnx"))
        assert [t.SerializeToString() for t in _all_tensors(shipped)] == [
            t.SerializeToString() for t in _get_all_tensors(shipped)
        ]
