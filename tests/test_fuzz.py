"""A short run of the randomized equivalence fuzzer (benchmarks/fuzz.py) on fixed seeds: random
modules through both exporters, random selections, each rewrite compared with the original in
onnxruntime. The long run is a benchmark command (README, "The fuzzer")."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from benchmarks.fuzz import FAILURES, draw_model, run_model

SEEDS = [0, 1, 2, 4]  # sequence and image families, TorchScript at opsets 14, 16, 17 and dynamo


def test_the_seeds_cover_both_exporters_and_families():
    drawn = [draw_model(s) for s in SEEDS]
    assert {m.exporter for m in drawn} == {"torchscript", "dynamo"}
    assert {m.family for m in drawn} == {"seq", "conv"}


@pytest.mark.parametrize("seed", SEEDS)
def test_fuzz_cases_pass(seed, tmp_path):
    cases = run_model(seed, 3, tmp_path)
    assert cases
    failed = [(c.selection, c.outcome, c.detail) for c in cases if c.outcome in FAILURES]
    assert not failed, failed
