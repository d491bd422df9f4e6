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
        model, str(tmp_path / "ext.onnx"), save_as_external_data=True, location="ext.onnx.data", size_threshold=0
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
