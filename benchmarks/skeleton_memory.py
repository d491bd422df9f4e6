"""What ONNX's shape inference and checker cost in memory on a model with large weights, whole
against the data-free skeleton onnx-remat hands them (:mod:`onnx_remat.graph.skeleton`).

    python -m benchmarks.skeleton_memory [--mib 400]

Builds a model of one MatMul whose weight initializer is ``--mib`` MiB, then, each in a fresh
process, records the peak RSS above the RSS with the model built (the peak is reset first: Linux's
``clear_refs``) of:

* ``infer whole``: ``onnx.shape_inference.infer_shapes(model)`` (what :class:`TensorSizes` did);
* ``TensorSizes``: ``TensorSizes(model)`` (inference on the skeleton, small initializers kept);
* ``check whole``: ``onnx.checker.check_model(model)`` on the whole model;
* ``check_runtime_support``: onnx-remat's validity check (checker on the skeleton, shapes too).

Prints one Markdown table. The absolute figures depend on the allocator; the row against row
ratio is the point.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

CASES = ("infer whole", "TensorSizes", "check whole", "check_runtime_support")


def _model(mib: int):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    cols = mib * 2**20 // (4 * 1024)
    weight = numpy_helper.from_array(np.ones((1024, cols), dtype=np.float32), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, cols])],
        [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _status_gib(field: str) -> float:
    """``VmRSS`` or ``VmHWM`` (the peak) of this process, from /proc/self/status, in GiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 2**20
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    """Start the peak RSS (VmHWM) again from the current RSS (Linux: clear_refs 5), so that what
    building the model took does not hide what the case takes."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def run_case(case: str, mib: int) -> float:
    """In this process: build the model, run ``case``, return the peak RSS it added (GiB)."""
    import onnx

    from onnx_remat.analysis.sizes import TensorSizes
    from onnx_remat.ortsim.registry import check_runtime_support

    model = _model(mib)
    _reset_peak()
    base = _status_gib("VmRSS")
    if case == "infer whole":
        onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    elif case == "TensorSizes":
        TensorSizes(model)
    elif case == "check whole":
        onnx.checker.check_model(model)
    elif case == "check_runtime_support":
        check_runtime_support(model, shapes=True)
    else:
        raise ValueError(case)
    return _status_gib("VmHWM") - base


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=400, help="the weight's size in MiB (default 400)")
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # one case, in a child
    args = parser.parse_args(argv)
    if args.case:
        print(f"{run_case(args.case, args.mib):.3f}")
        return 0
    print(f"| one {args.mib} MiB weight | peak RSS added |")
    print("|---|---:|")
    for case in CASES:
        cmd = [sys.executable, "-m", "benchmarks.skeleton_memory", "--mib", str(args.mib), "--case", case]
        added = float(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip())
        print(f"| {case} | {added:.2f} GiB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
