"""Export the example models to onnxruntime-training artifacts.

    python -m models.export [NAME ...] [--out DIR]
    python -m models.export --corpus [NAME ...] [--out DIR]
    python -m models.export --corpus gpt2_small_ts         # GPT-2 at its real width, ~500 MB

writes, for each model (default: all of ``models.MODELS``), ``DIR/<name>/`` (default
``models/artifacts/<name>/``; with ``--corpus``, the real architectures of :mod:`models.corpus`
into ``.cache/corpus/<name>/``) with ``training_model.onnx``, ``eval_model.onnx``,
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
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import onnx
import torch

from onnx_remat.exporters import export_for_training, trainable_parameter_names
from onnx_remat.runtime.artifacts import ONNX_FILES, generate_training_artifacts

from . import ARTIFACTS_DIR_NAME, MODELS, ModelSpec
from .corpus import CORPUS, LARGE
from .realsize import REALSIZE

DEFAULT_OUT = Path(__file__).resolve().parent / ARTIFACTS_DIR_NAME
CORPUS_OUT = Path(__file__).resolve().parents[1] / ".cache" / "corpus"
REALSIZE_OUT = Path(__file__).resolve().parents[1] / ".cache" / "realsize"


def export_onnx(spec: ModelSpec, module: torch.nn.Module | None = None) -> tuple[onnx.ModelProto, torch.nn.Module]:
    """The forward ONNX model of ``spec`` in training mode, ready for ``generate_artifacts``.

    Returns the model and the module it was exported from (built by ``spec.build()`` unless
    given); :func:`onnx_remat.exporters.export_for_training` does the work. The module's state is
    the same after the export as before.
    """
    module = spec.build() if module is None else module
    model = export_for_training(
        module,
        spec.example_inputs(),
        exporter=spec.exporter,
        opset=spec.opset,
        input_names=spec.input_names,
        output_names=spec.output_names,
    )
    return model, module


def generate(spec: ModelSpec, model: onnx.ModelProto, module: torch.nn.Module, out_dir: Path) -> None:
    """Write the training artifacts of ``model`` (AdamW) into the (existing, empty) ``out_dir``."""
    generate_training_artifacts(
        model,
        out_dir,
        requires_grad=trainable_parameter_names(model, module, strict=True),
        loss=spec.ort_loss,
    )


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
    sizes = ", ".join(f"{p.name} {p.stat().st_size / 1024:.0f} KiB" for p in sorted(path.iterdir()) if p.is_file())
    return f"{len(training.graph.node)} training nodes, {len(evalm.graph.node)} eval nodes; {sizes}"


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m models.export [--corpus] [NAME ...] [--out DIR]``."""
    parser = argparse.ArgumentParser(
        prog="python -m models.export",
        description="Export the example models (or, with --corpus, the corpus of real architectures) "
        "to onnxruntime-training artifacts directories.",
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help="models (default: all)")
    parser.add_argument(
        "--corpus",
        action="store_true",
        help=f"the corpus of real architectures (models/corpus.py): {', '.join(CORPUS)}; also, when named, "
        f"{', '.join(LARGE)} (real width, ~500 MB)",
    )
    parser.add_argument(
        "--realsize",
        action="store_true",
        help=f"the real-size models (models/realsize.py): {', '.join(REALSIZE)}; minutes and GBs each",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"output folder (default: models/artifacts; {CORPUS_OUT} with --corpus, {REALSIZE_OUT} with --realsize)",
    )
    args = parser.parse_args(argv)
    if args.corpus and args.realsize:
        parser.error("give --corpus or --realsize, not both")
    registry = {**CORPUS, **LARGE} if args.corpus else REALSIZE if args.realsize else MODELS
    out = args.out or (CORPUS_OUT if args.corpus else REALSIZE_OUT if args.realsize else DEFAULT_OUT)
    names = args.names or list(CORPUS if args.corpus else REALSIZE if args.realsize else MODELS)
    unknown = [n for n in names if n not in registry]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(registry)}")
    for name in names:
        start = time.perf_counter()
        path = export_artifacts(registry[name], out)
        print(f"{name}: {path} ({time.perf_counter() - start:.1f} s): {summary(path)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
