"""Export the example models to onnxruntime-training artifacts.

    python -m models.export [NAME ...] [--out DIR]

writes, for each model (default: all of ``models.MODELS``), ``DIR/<name>/`` (default
``models/artifacts/<name>/``) with ``training_model.onnx``, ``eval_model.onnx``,
``optimizer_model.onnx`` (AdamW) and ``checkpoint``, made by
``onnxruntime.training.artifacts.generate_artifacts``.

What the export does beyond calling the exporter and ``generate_artifacts``:

* TorchScript (``dynamo=False``, opset 17, ``TrainingMode.TRAINING``, no constant folding):
  running-statistics buffers (BatchNorm) are put back to their values before the export (tracing
  runs one train-mode forward, which updates them, and the exported initializers are the updated
  values); :func:`onnx_remat.exporters.add_gradient_outputs` (LayerNormalization needs its mean and
  inv-std outputs) and :func:`onnx_remat.exporters.annotate_scopes` (dynamo-style scope metadata,
  kept by ``generate_artifacts`` in ``eval_model.onnx``).
* dynamo (``dynamo=True``, opset 18): :func:`onnx_remat.exporters.fix_dynamo_training_export`.
* ``requires_grad`` is :func:`onnx_remat.exporters.trainable_parameter_names`.
* ``eval_model.onnx`` goes through :func:`onnx_remat.exporters.fix_eval_model`: as written, the
  eval model of a network with BatchNorm does not load (``generate_artifacts`` sets
  ``training_mode=0`` but leaves the running-statistics outputs of the training-mode node).
* onnxblock's global name counter is reset before each model, so names such as
  ``onnx::reducemean_output::6`` do not depend on which models were exported before in the
  same process; ``optimizer_model.onnx`` (which onnxblock writes with ``onnx.IR_VERSION``, too
  new for onnxruntime 1.19) gets the training model's IR version.
* Every written model is checked: IR version <= 10, default-domain opset <= 21.

The output is deterministic: two runs write byte-identical ``.onnx`` files and checkpoints.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import onnx
import torch
from onnx import numpy_helper

from onnx_remat.exporters import (
    add_gradient_outputs,
    annotate_scopes,
    fix_dynamo_training_export,
    fix_eval_model,
    trainable_parameter_names,
)

from . import ARTIFACTS_DIR_NAME, MODELS, ModelSpec

MAX_IR_VERSION = 10
MAX_OPSET = 21
ONNX_FILES = ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx")
DEFAULT_OUT = Path(__file__).resolve().parent / ARTIFACTS_DIR_NAME


def _quiet():
    """Silence the exporters' deprecation and train-mode warnings."""
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    # "torchvision is not installed. Skipping torchvision::nms" and the like
    log = logging.getLogger("torch.onnx")
    level = log.level
    log.setLevel(logging.ERROR)
    stack.callback(log.setLevel, level)
    return stack


@contextlib.contextmanager
def _native_stderr_to_file():
    """Send file descriptor 2 to a temporary file while the block runs.

    The gradient-graph builder of ``generate_artifacts`` logs every graph transformer at INFO level
    from C++, whatever ``onnxruntime.set_default_logger_severity`` says. On an exception the
    captured text is written back to stderr.
    """
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


def _restore_buffers(model: onnx.ModelProto, buffers: dict[str, torch.Tensor]) -> onnx.ModelProto:
    """Set initializers named like module buffers back to the given (pre-export) values."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for i, init in enumerate(out.graph.initializer):
        if init.name in buffers:
            value = buffers[init.name].detach().cpu().numpy()
            out.graph.initializer[i].CopyFrom(numpy_helper.from_array(value, init.name))
    return out


def export_onnx(spec: ModelSpec, module: torch.nn.Module | None = None) -> tuple[onnx.ModelProto, torch.nn.Module]:
    """The forward ONNX model of ``spec`` in training mode, ready for ``generate_artifacts``.

    Returns the model and the module it was exported from (built by ``spec.build()`` unless
    given). The module's state is the same after the export as before.
    """
    module = spec.build() if module is None else module
    module.train()
    inputs = spec.example_inputs()
    buffers = {k: v.clone() for k, v in module.named_buffers()}
    with _quiet():
        if spec.exporter == "torchscript":
            f = io.BytesIO()
            torch.onnx.export(
                module,
                inputs,
                f,
                dynamo=False,
                opset_version=spec.opset,
                training=torch.onnx.TrainingMode.TRAINING,
                do_constant_folding=False,
                input_names=list(spec.input_names),
                output_names=list(spec.output_names),
            )
            model = onnx.load_from_string(f.getvalue())
            model = _restore_buffers(model, buffers)
            model = add_gradient_outputs(model)
            model = annotate_scopes(model, module)
        elif spec.exporter == "dynamo":
            program = torch.onnx.export(
                module,
                inputs,
                dynamo=True,
                opset_version=spec.opset,
                training=torch.onnx.TrainingMode.TRAINING,
                input_names=list(spec.input_names),
                output_names=list(spec.output_names),
                verbose=False,
            )
            model = fix_dynamo_training_export(program.model_proto)
        else:
            raise ValueError(f"{spec.name}: unknown exporter {spec.exporter!r}")
    with torch.no_grad():
        for name, buf in module.named_buffers():
            buf.copy_(buffers[name])
    return model, module


def _ort_loss(kind: str):
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
    raise ValueError(f"unknown loss {kind!r}")


def check_versions(model: onnx.ModelProto, where: str) -> None:
    """Raise ``ValueError`` unless IR version <= 10 and default-domain opset <= 21."""
    if model.ir_version > MAX_IR_VERSION:
        raise ValueError(f"{where}: IR version {model.ir_version} > {MAX_IR_VERSION}")
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx") and op.version > MAX_OPSET:
            raise ValueError(f"{where}: opset {op.version} > {MAX_OPSET}")


def generate(spec: ModelSpec, model: onnx.ModelProto, module: torch.nn.Module, out_dir: Path) -> None:
    """Run ``generate_artifacts`` for ``model`` into the (existing, empty) ``out_dir``."""
    import onnxruntime
    from onnxruntime.training import artifacts
    from onnxruntime.training.onnxblock import _graph_utils

    check_versions(model, f"{spec.name} (forward export)")
    onnxruntime.set_default_logger_severity(3)
    _graph_utils._GRAPH_TOKEN = 0  # onnxblock names nodes with a process-wide counter
    # A ModelProto (not a path) keeps onnxblock from writing temporary files into the cwd.
    with _native_stderr_to_file():
        artifacts.generate_artifacts(
            model,
            requires_grad=trainable_parameter_names(model, module, strict=True),
            loss=_ort_loss(spec.ort_loss),
            optimizer=artifacts.OptimType.AdamW,
            artifact_directory=str(out_dir),
        )
    training = onnx.load(str(out_dir / "training_model.onnx"), load_external_data=False)
    eval_path = out_dir / "eval_model.onnx"
    evalm = onnx.load(str(eval_path))
    fixed = fix_eval_model(evalm)
    if fixed != evalm:
        onnx.save(fixed, str(eval_path))
    opt_path = out_dir / "optimizer_model.onnx"
    optimizer = onnx.load(str(opt_path))
    if optimizer.ir_version != training.ir_version:
        optimizer.ir_version = training.ir_version
        onnx.save(optimizer, str(opt_path))
    for fname in ONNX_FILES:
        m = onnx.load(str(out_dir / fname), load_external_data=False)
        check_versions(m, f"{spec.name}/{fname}")
        onnx.checker.check_model(m)


def export_artifacts(spec: ModelSpec, out: Path = DEFAULT_OUT) -> Path:
    """Export ``spec`` and write its artifacts directory ``out/<name>`` (replacing it)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    final = out / spec.name
    model, module = export_onnx(spec)
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}.", dir=out))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        generate(spec, model, module, tmp)
        extra = sorted(p.name for p in tmp.iterdir() if p.name not in (*ONNX_FILES, "checkpoint"))
        for name in extra:  # onnxblock's temporary files, if any were left
            p = tmp / name
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def summary(path: Path) -> str:
    """One line: node counts of the training and eval graphs and the file sizes."""
    training = onnx.load(str(path / "training_model.onnx"), load_external_data=False)
    evalm = onnx.load(str(path / "eval_model.onnx"), load_external_data=False)
    sizes = ", ".join(
        f"{p.name} {p.stat().st_size / 1024:.0f} KiB" for p in sorted(path.iterdir()) if p.is_file()
    )
    return (
        f"{len(training.graph.node)} training nodes, {len(evalm.graph.node)} eval nodes; {sizes}"
    )


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m models.export [NAME ...] [--out DIR]``."""
    parser = argparse.ArgumentParser(
        prog="python -m models.export",
        description="Export the example models to onnxruntime-training artifacts directories.",
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"models (default: all): {', '.join(MODELS)}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: models/artifacts)")
    args = parser.parse_args(argv)
    names = args.names or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    for name in names:
        start = time.perf_counter()
        path = export_artifacts(MODELS[name], args.out)
        print(f"{name}: {path} ({time.perf_counter() - start:.1f} s): {summary(path)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
