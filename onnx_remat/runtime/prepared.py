"""A model ready for the measuring workers, shared by :mod:`.measure` and :mod:`.compare`.

* :class:`ModelSource` (:func:`model_source`): the file onnxruntime reads, its proto, its
  checkpoint, and whether it is a forward-only graph;
* :class:`PreparedModel`: a source with its feeds (:class:`~.inputs.PreparedFeeds`) and the file
  they were saved to, what a worker spec is built from;
* :func:`check_checkpoint`: a checkpoint file checked before a worker starts;
* :class:`Workdir`: the temporary folder the workers write in (kept with
  ``ONNX_REMAT_KEEP_WORKDIR=1``).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import onnx

from onnx_remat.errors import RematError
from onnx_remat.model_io import forward_only_hint, load_model, save_model
from onnx_remat.ortsim.registry import check_text
from onnx_remat.runtime.inputs import PreparedFeeds

KEEP_ENV = "ONNX_REMAT_KEEP_WORKDIR"  # set to 1 to keep the worker's files (logs, profile) for a look

FORWARD_ONLY_NOTE = (
    "a forward-only graph (no gradient nodes): one forward step, no gradients; 'loss' is its first output"
)


@dataclass
class ModelSource:
    """A model ready for a worker: the file onnxruntime reads, the proto, its checkpoint."""

    label: str
    path: Path
    model: onnx.ModelProto
    checkpoint: Path | None
    forward_only: bool = False


def model_source(model, checkpoint, tmp: Path, name: str) -> ModelSource:
    """``model`` (a training graph file, an artifacts directory, or a ModelProto, written to
    ``tmp/<name>.onnx``) as a :class:`ModelSource`; its checkpoint is ``checkpoint`` if given, else
    the artifacts checkpoint beside the file (none for a ModelProto)."""
    if isinstance(model, onnx.ModelProto):
        label = f"<{name}: in-memory model>"
        check_text(model, label)
        ckpt = Path(checkpoint) if checkpoint else None
        forward_only = _forward_only(model, label, None, ckpt)
        path = save_model(model, tmp / f"{name}.onnx")
        return ModelSource(label, path, model, ckpt, forward_only)
    loaded = load_model(model, check=False)
    check_text(loaded.model, loaded.path)  # the analysis below reads names; onnxruntime judges the rest
    ckpt = Path(checkpoint) if checkpoint else loaded.checkpoint_path
    forward_only = _forward_only(loaded.model, str(loaded.path), loaded.path, ckpt)
    return ModelSource(str(loaded.path), loaded.path, loaded.model, ckpt, forward_only)


def _forward_only(model: onnx.ModelProto, label: str, path: Path | None, checkpoint: Path | None) -> bool:
    """Whether ``model`` has no gradient nodes. Such a graph is run as one forward step (and says
    so), except with a checkpoint: then it is an artifacts ``eval_model.onnx`` whose parameters
    the worker would not read from the checkpoint but synthesize, and it is refused, naming the
    training graph beside it."""
    from onnx_remat.analysis.regions import is_forward_only
    from onnx_remat.errors import ForwardOnlyGraph

    if not is_forward_only(model):
        return False  # (other oddities of the forward/backward split do not matter for running it)
    if checkpoint is None:
        return True
    raise ForwardOnlyGraph(
        f"{label}: a forward-only graph (no gradient nodes) with a checkpoint, so an artifacts eval model "
        f"(measured, its parameters would be synthesized, not read): {forward_only_hint(path)}"
    )


_CHECKPOINT_ID = b"ODTC"  # flatbuffers file identifier of onnxruntime-training checkpoints


def check_checkpoint(path: Path | None) -> None:
    """A checkpoint must be an onnxruntime-training checkpoint file: checked here, in one line,
    before a worker starts (onnxruntime's own message names its C++ source file)."""
    if path is None:
        return
    if not path.exists():
        raise RematError(f"{path}: no such checkpoint")
    if not path.is_file():
        raise RematError(f"{path}: not a regular file; --checkpoint takes an onnxruntime-training checkpoint file")
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        raise RematError(f"{path}: cannot read ({exc.strerror})") from None
    if head[4:8] != _CHECKPOINT_ID:
        raise RematError(
            f"{path}: not an onnxruntime-training checkpoint (as written by generate_artifacts or "
            "CheckpointState.save_checkpoint)"
        )


@dataclass
class PreparedModel:
    """A model source with the feeds of its steps and the file they were saved to (the
    ``feeds`` of a worker spec)."""

    source: ModelSource
    feeds: PreparedFeeds
    feeds_path: Path


class Workdir:
    """A temporary folder for the workers' files, removed afterwards unless ONNX_REMAT_KEEP_WORKDIR=1."""

    def __init__(self, prefix: str):
        self.path = Path(tempfile.mkdtemp(prefix=prefix))

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc) -> None:
        if os.environ.get(KEEP_ENV) == "1":
            print(f"onnx-remat: worker files kept in {self.path}", file=sys.stderr)
        else:
            shutil.rmtree(self.path, ignore_errors=True)
