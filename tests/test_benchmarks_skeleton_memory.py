"""benchmarks.skeleton_memory: the skeleton spares shape inference the weights' copies.

Peak RSS, not time: a whole-model ``infer_shapes`` copies a 64 MiB weight about four times (in,
out, each serialized and parsed), TensorSizes on the skeleton not at all, a margin that allocator
noise (a few MiB) cannot close."""

from __future__ import annotations

from benchmarks.skeleton_memory import CASES, main


def test_sizes_on_the_skeleton_add_no_copy_of_the_weights(capsys):
    assert main(["--mib", "64"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "GiB" in line]
    added = {row.split("|")[1].strip(): float(row.split("|")[2].split()[0]) for row in rows}
    assert list(added) == list(CASES)
    whole, skeleton = added["infer whole"], added["TensorSizes"]
    assert whole >= 0.15, f"inference on the whole model should copy the 64 MiB weight: {added}"
    assert skeleton < whole / 4, added
    assert added["check_runtime_support"] < added["check whole"], added
