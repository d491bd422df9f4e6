"""Training artifacts from a forward ONNX model: ``generate_artifacts`` with the fixes it needs.

:func:`generate_training_artifacts` calls ``onnxruntime.training.artifacts.generate_artifacts``
(a training graph with the loss and gradients, an eval graph, an optimizer graph, a checkpoint)
and repairs what it writes so that onnxruntime-training 1.19 itself loads all of it:

* ``eval_model.onnx`` of a model with training-mode BatchNormalization goes through
  :func:`onnx_remat.exporters.fix_eval_model` (as written, onnxruntime refuses it);
* ``optimizer_model.onnx`` gets the training graph's IR version (onnxblock writes onnx's newest,
  which onnxruntime 1.19 refuses);
* onnxblock's process-wide name counter is reset first, so the names it gives
  (``onnx::reducemean_output::6``) do not depend on what was generated before in the process;
* the gradient builder's C++ INFO log (one line per graph transformer, whatever the log
  severity) is kept off the terminal and shown only when generation fails.

Every file written is checked with :func:`onnx_remat.ortsim.registry.check_runtime_support`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import onnx

from onnx_remat.errors import RematError
from onnx_remat.exporters import fix_eval_model
from onnx_remat.ortsim.registry import check_runtime_support

ONNX_FILES = ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx")
LOSSES = ("mse", "cross_entropy", "mean")


@contextlib.contextmanager
def _native_stderr_to_file() -> Iterator[None]:
    """File descriptor 2 goes to a temporary file while the block runs; replayed on an exception."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            tmp.seek(0)
            lines = tmp.read().decode(errors="replace").splitlines()
            tail = [line for line in lines if "[I:onnxruntime" not in line][-40:]
            if tail:
                print("\n".join(tail), file=sys.stderr)
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _loss_block(kind: str):
    from onnxruntime.training import artifacts, onnxblock

    if kind == "mse":
        return artifacts.LossType.MSELoss
    if kind == "cross_entropy":
        return artifacts.LossType.CrossEntropyLoss
    if kind == "mean":

        class MeanLoss(onnxblock.Block):
            """``ReduceMean`` over all axes of the model output (``y_pred.mean()``)."""

            def __init__(self) -> None:
                super().__init__()
                self._mean = onnxblock.blocks.ReduceMean(keepdims=False)

            def build(self, output_name: str) -> str:
                return self._mean(output_name)

        return MeanLoss()
    raise RematError(f"unknown loss {kind!r}; one of {', '.join(LOSSES)}")


def generate_training_artifacts(
    model: onnx.ModelProto,
    out_dir: str | os.PathLike,
    *,
    requires_grad: Sequence[str],
    loss: str = "mse",
    optimizer: str = "AdamW",
) -> Path:
    """Write training artifacts for the forward ``model`` into the existing, empty ``out_dir``.

    ``loss``: ``"mse"`` (``LossType.MSELoss``), ``"cross_entropy"`` (``LossType.CrossEntropyLoss``,
    classes on axis 1) or ``"mean"`` (``ReduceMean`` of the output over all axes). ``optimizer``:
    a member of ``onnxruntime.training.artifacts.OptimType``. ``requires_grad``: the trainable
    parameters (:func:`onnx_remat.exporters.trainable_parameter_names`). Returns ``out_dir``.
    """
    from onnx_remat.runtime.session import import_onnxruntime

    ort = import_onnxruntime(block_torch=False)
    from onnxruntime.training import artifacts
    from onnxruntime.training.onnxblock import _graph_utils

    out = Path(out_dir)
    check_runtime_support(model, "forward model")
    ort.set_default_logger_severity(3)
    _graph_utils._GRAPH_TOKEN = 0  # onnxblock names nodes with a process-wide counter
    # A ModelProto (not a path) keeps onnxblock from writing temporary files into the cwd.
    with _native_stderr_to_file():
        artifacts.generate_artifacts(
            model,
            requires_grad=list(requires_grad),
            loss=_loss_block(loss),
            optimizer=getattr(artifacts.OptimType, optimizer),
            artifact_directory=str(out),
        )
    training = onnx.load(str(out / "training_model.onnx"), load_external_data=False)
    eval_path = out / "eval_model.onnx"
    evalm = onnx.load(str(eval_path))
    fixed = fix_eval_model(evalm)
    if fixed != evalm:
        onnx.save(fixed, str(eval_path))
    opt_path = out / "optimizer_model.onnx"
    opt = onnx.load(str(opt_path))
    if opt.ir_version != training.ir_version:
        opt.ir_version = training.ir_version
        onnx.save(opt, str(opt_path))
    for name in ONNX_FILES:
        check_runtime_support(onnx.load(str(out / name), load_external_data=False), out / name)
    return out
