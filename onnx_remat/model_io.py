"""Reading and writing ONNX models and onnxruntime-training artifacts directories, safely.

* :func:`load_model` reads a model file, or the ``training_model.onnx`` of an artifacts directory
  (as written by ``onnxruntime.training.artifacts.generate_artifacts``), with or without external
  data, and turns every way a file can be broken into a one-line :class:`RematError`.
* :func:`save_model` and :func:`write_artifacts` write atomically (a temporary file or folder in
  the same directory, then a rename), refuse to replace an existing output unless ``force`` is
  given, and never write over the input they were made from unless ``force`` says so.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from onnx_remat.errors import RematError, one_line
from onnx_remat.ortsim.registry import check_runtime_support

TRAINING_MODEL = "training_model.onnx"
EVAL_MODEL = "eval_model.onnx"
CHECKPOINT = "checkpoint"

# protobuf cannot serialize a message of 2 GiB or more: such models must use external data.
_PROTOBUF_LIMIT = 2**31 - 1


@dataclass
class LoadedModel:
    """A model read from disk and where it came from.

    ``artifacts_dir`` is set when the model is the training graph of an artifacts directory
    (given as the directory or as the file inside it); ``external_data`` when any of its
    tensors were stored in separate files.
    """

    model: onnx.ModelProto
    path: Path
    artifacts_dir: Path | None
    external_data: bool

    @property
    def eval_model_path(self) -> Path | None:
        """``eval_model.onnx`` beside the training graph, if there is one."""
        candidate = self.path.parent / EVAL_MODEL
        return candidate if candidate.is_file() and candidate != self.path else None

    @property
    def checkpoint_path(self) -> Path | None:
        """The artifacts checkpoint beside the training graph, if there is one."""
        candidate = self.path.parent / CHECKPOINT
        return candidate if candidate.exists() else None


def find_model_file(path: str | os.PathLike) -> tuple[Path, Path | None]:
    """Resolve MODEL as the user gave it: returns (onnx file, artifacts directory or None)."""
    p = Path(path)
    if not p.exists():
        raise RematError(f"{p}: no such file or directory")
    if p.is_dir():
        if not (p / TRAINING_MODEL).is_file():
            raise RematError(
                f"{p}: a directory without {TRAINING_MODEL}; give an ONNX file or an artifacts "
                "directory written by onnxruntime.training.artifacts.generate_artifacts"
            )
        return p / TRAINING_MODEL, p
    parent = p.parent
    in_artifacts = p.name == TRAINING_MODEL and (parent / CHECKPOINT).exists()
    return p, (parent if in_artifacts else None)


def load_model(path: str | os.PathLike, *, check: bool = True) -> LoadedModel:
    """Read an ONNX model (file or artifacts directory), with its external data.

    Raises :class:`RematError` with one line naming the file when it is missing, not ONNX,
    truncated, refers to external data that is not there, or is a graph onnxruntime 1.19 would
    refuse (:func:`onnx_remat.ortsim.registry.check_runtime_support`).
    """
    file, artifacts_dir = find_model_file(path)
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise RematError(f"{file}: cannot read ({exc.strerror})") from None
    if not data:
        raise RematError(f"{file}: empty file, not an ONNX model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except DecodeError:
        raise RematError(f"{file}: not an ONNX model, or truncated (protobuf parse error)") from None
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise RematError(f"{file}: not an ONNX model (no graph in it)")
    external = _uses_external_data(model)
    if external:
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(file.parent))
        except (OSError, ValueError) as exc:
            raise RematError(f"{file}: its external data cannot be read: {one_line(exc)}") from None
    if check:
        check_runtime_support(model, file)
    return LoadedModel(model=model, path=file, artifacts_dir=artifacts_dir, external_data=external)


def _uses_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in onnx.external_data_helper._get_all_tensors(model))


def _refuse_overwrite(out: Path, inputs: tuple[Path, ...], force: bool) -> None:
    for src in inputs:
        if src is not None and out.exists() and _same_path(out, src) and not force:
            raise RematError(f"{out}: this is the input; give another output path or --force")
    if out.exists() and not force:
        raise RematError(f"{out}: already exists; give --force to replace it")


def _same_path(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def write_file(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` atomically (a temporary file in the same folder, then a rename).

    The file gets the permissions a plain ``open()`` would give (``mkstemp`` makes 0600). Raises
    :class:`RematError` with one line when the folder is missing or not writable.
    """
    out = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    except OSError as exc:
        raise RematError(f"{out}: cannot write ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, out)
    except OSError as exc:
        raise RematError(f"{out}: cannot write ({exc.strerror})") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def save_model(
    model: onnx.ModelProto,
    path: str | os.PathLike,
    *,
    force: bool = False,
    inputs: tuple[str | os.PathLike, ...] = (),
    external_data: bool | None = None,
) -> Path:
    """Write ``model`` to ``path`` atomically; returns the path.

    ``inputs`` are the files the model was made from: writing over one of them needs
    ``force``, as does replacing any existing file. Tensors go to an external data file
    ``<name>.data`` when ``external_data`` is True, or (by default) when the model is too large
    for one protobuf message.
    """
    out = Path(path)
    _refuse_overwrite(out, tuple(Path(p) for p in inputs), force)
    if not out.parent.exists():
        raise RematError(f"{out.parent}: output directory does not exist")
    if external_data is None:
        external_data = model.ByteSize() >= _PROTOBUF_LIMIT
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tmp_model = tmpdir / out.name
        if external_data:
            location = out.name + ".data"
            copy = onnx.ModelProto()
            copy.CopyFrom(model)  # onnx.save moves tensor bytes out of the message it is given
            onnx.save_model(
                copy,
                str(tmp_model),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=location,
                size_threshold=1024,
            )
            if (tmpdir / location).exists():  # not written when every tensor is small
                os.replace(tmpdir / location, out.parent / location)
        else:
            onnx.save_model(model, str(tmp_model))
        os.replace(tmp_model, out)
    except OSError as exc:
        raise RematError(f"{out}: cannot write ({exc.strerror})") from None
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return out


def write_artifacts(
    src_dir: str | os.PathLike,
    dst_dir: str | os.PathLike,
    training_model: onnx.ModelProto,
    *,
    force: bool = False,
) -> Path:
    """Write a complete artifacts directory: ``training_model`` plus everything else of ``src_dir``.

    The checkpoint, eval and optimizer models (and any other files) are copied unchanged, so
    onnxruntime-training's ``Module`` loads the result like the original. The new directory is
    assembled beside ``dst_dir`` and renamed into place; an existing ``dst_dir`` (the source
    itself included) is only replaced with ``force``.
    """
    src, dst = Path(src_dir), Path(dst_dir)
    _refuse_overwrite(dst, (src,), force)
    if not dst.parent.exists():
        raise RematError(f"{dst.parent}: output directory does not exist")
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700; it becomes the output directory
    try:
        for item in src.iterdir():
            if item.name == TRAINING_MODEL or item.name.startswith(TRAINING_MODEL + "."):
                continue  # the training graph (and its external data) is rewritten below
            if item.is_dir():
                shutil.copytree(item, tmp / item.name)
            else:
                shutil.copy2(item, tmp / item.name)
        save_model(training_model, tmp / TRAINING_MODEL)
        if dst.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.old.", dir=dst.parent))
            os.replace(dst, old / dst.name)
            os.replace(tmp, dst)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dst)
    except OSError as exc:
        raise RematError(f"{dst}: cannot write ({exc.strerror})") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dst
