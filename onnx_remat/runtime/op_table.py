"""Generate :mod:`onnx_remat.ortsim.ops_table`: which ops the installed onnxruntime registers beyond ONNX.

    python -m onnx_remat.runtime.op_table [--check]

onnxruntime-training 1.19 does not expose its schema registry to Python, so the table is read
off onnxruntime itself: every identifier in its native library (and each suffix of one that
starts with a capital: the linker shares string tails, so ``SoftmaxGrad_13`` is only stored
inside ``LogSoftmaxGrad_13``) is tried as an op type in a one-node model that a session loads
with optimizations off. onnxruntime answers "No Op registered for X" (default domain) or "X is
not a registered function/op" (other domains) for an op it does not know, and something else
(an input count out of range, say) for one it knows. Default-domain ops are tried at opsets
1-21; ops that ONNX itself defines at an opset are left out there. ``--check`` compares the
committed table with what the installed onnxruntime says and exits 1 on a difference.

The table lets analysis and rewrite judge a graph the way onnxruntime will (see
:mod:`onnx_remat.ortsim.registry`) without starting a session.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from onnx_remat.runtime.session import import_onnxruntime

MIN_OPSET, MAX_OPSET = 1, 21
DOMAINS = ("com.microsoft", "com.microsoft.nchwc", "org.pytorch.aten", "ai.onnx.ml", "ai.onnx.preview.training")
TABLE = Path(__file__).resolve().parents[1] / "ort_ops.py"
_IDENT = re.compile(rb"[A-Z][A-Za-z0-9_]{1,63}")


def candidate_names(library: Path) -> list[str]:
    """Identifiers in the library's bytes, and their suffixes that start with a capital letter."""
    names: set[str] = set()
    for match in _IDENT.finditer(library.read_bytes()):
        word = match.group().decode()
        for i, ch in enumerate(word):
            if ch.isupper() and len(word) - i >= 2:
                names.add(word[i:])
    return sorted(names)


class Prober:
    """Asks onnxruntime whether it knows ``domain::op`` at a default-domain opset."""

    def __init__(self) -> None:
        self.ort = import_onnxruntime()
        self.ort.set_default_logger_severity(4)
        self.options = self.ort.SessionOptions()
        self.options.graph_optimization_level = self.ort.GraphOptimizationLevel.ORT_DISABLE_ALL

    def knows(self, op: str, domain: str, opset: int) -> bool:
        node = helper.make_node(op, ["x"], ["y"], domain=domain)
        graph = helper.make_graph(
            [node],
            "probe",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        )
        imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
        model = helper.make_model(graph, opset_imports=imports, ir_version=8)
        try:
            self.ort.InferenceSession(model.SerializeToString(), self.options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types; the text tells
            text = str(exc)
            return not ("No Op registered for" in text or "is not a registered function/op" in text)
        return True


def _onnx_knows(op: str, opset: int) -> bool:
    return onnx.defs.has(op, opset, "")


def build_table(prober: Prober, names: list[str]) -> tuple[dict[str, list[int]], dict[str, list[str]]]:
    """(default-domain op -> opsets where onnxruntime knows it and ONNX does not, domain -> ops)."""
    onnx_domain: dict[str, list[int]] = {}
    for op in names:
        if not any(prober.knows(op, "", v) for v in (MIN_OPSET, 13, 17, MAX_OPSET)):
            continue
        extra = [v for v in range(MIN_OPSET, MAX_OPSET + 1) if not _onnx_knows(op, v) and prober.knows(op, "", v)]
        if extra:
            onnx_domain[op] = extra
    other = {d: [op for op in names if prober.knows(op, d, MAX_OPSET)] for d in DOMAINS}
    return onnx_domain, other


def _ranges(opsets: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for v in opsets:
        if out and out[-1][1] == v - 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


def render(onnx_domain: dict[str, list[int]], other: dict[str, list[str]], version: str) -> str:
    """The source text of :mod:`onnx_remat.ortsim.ops_table`."""
    lines = [
        f'"""Ops onnxruntime {version} registers beyond the ONNX standard (generated; do not edit).',
        "",
        "Written by ``python -m onnx_remat.runtime.op_table`` from the installed onnxruntime: see that",
        "module for how. :mod:`onnx_remat.ortsim.registry` reads it.",
        '"""',
        "",
        f'ONNXRUNTIME_VERSION = "{version}"',
        "",
        "# Default-domain op -> the inclusive opset ranges at which onnxruntime knows it and ONNX does not",
        "# (e.g. its own LayerNormalization before ONNX's of opset 17).",
        "ONNX_DOMAIN_OPSETS: dict[str, tuple[tuple[int, int], ...]] = {",
    ]
    for op in sorted(onnx_domain):
        ranges = ", ".join(f"({a}, {b})" for a, b in _ranges(onnx_domain[op]))
        lines.append(f'    "{op}": ({ranges},),')
    lines += [
        "}",
        "",
        "# Other domains -> the ops onnxruntime knows there (opset 1 of the domain).",
        "DOMAIN_OPS: dict[str, frozenset[str]] = {",
    ]
    for domain in sorted(other):
        ops = sorted(other[domain])
        lines.append(f'    "{domain}": frozenset(')
        lines.append("        {")
        lines += [f'            "{op}",' for op in ops]
        lines.append("        }")
        lines.append("    ),")
    lines += ["}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m onnx_remat.runtime.op_table", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed table instead of writing it")
    args = parser.parse_args(argv)
    prober = Prober()
    capi = Path(prober.ort.__file__).parent / "capi"
    library = next(capi.glob("onnxruntime_pybind11_state*.so"))
    onnx_domain, other = build_table(prober, candidate_names(library))
    text = render(onnx_domain, other, prober.ort.__version__)
    if args.check:
        same = TABLE.read_text() == text
        print("the committed table matches onnxruntime" if same else f"{TABLE} differs from the installed onnxruntime")
        return 0 if same else 1
    TABLE.write_text(text)
    print(
        f"wrote {TABLE}: {len(onnx_domain)} default-domain ops, "
        + ", ".join(f"{len(v)} in {d}" for d, v in sorted(other.items()))
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
