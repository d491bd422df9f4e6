"""A short fixed-seed run of the mutation fuzzer (benchmarks/mutate.py): one mutant of every
kind from the example graphs, every fast subcommand on each, onnxruntime's load as the oracle.
The long run is a benchmark command (README, "Models broken inside")."""

from __future__ import annotations

from benchmarks.mutate import BYTE_MUTATIONS, FAILURES, MUTATIONS, run


def test_one_mutant_of_every_kind_holds(tmp_path):
    kinds = len(MUTATIONS) + len(BYTE_MUTATIONS)
    summary = run(kinds, 11, "examples", tmp_path, slow_every=0, jobs=1)
    assert summary["mutants"] == kinds
    assert set(summary["per_mutation"]) == {*MUTATIONS, *BYTE_MUTATIONS}
    assert not summary["failed"], summary["failures"][:5]
    assert all(summary["runs"].get(f, 0) == 0 for f in FAILURES)
    # the oracle is not idle: most mutants are graphs onnxruntime refuses
    assert summary["refused_by_onnxruntime"] >= kinds // 2
    assert set(summary["per_command"]) == {
        "scopes",
        "estimate",
        "apply",
        "apply-budget",
        "schedule",
        "plan",
        "viz",
        "report",
    }
