"""A short fixed-seed run of the mutation fuzzer (benchmarks/mutate.py): one mutant of every
kind from the example graphs, every fast subcommand on each, onnxruntime's load as the oracle.
The long run is a benchmark command (README, "Models broken inside")."""

from __future__ import annotations

import random

import click
import onnx
from click.testing import CliRunner
from conftest import artifacts_dir

from benchmarks.mutate import BYTE_MUTATIONS, FAILURES, MUTATIONS, b_reorder_fields, ort_refuses, run, run_command


def test_one_mutant_of_every_kind_holds(tmp_path):
    kinds = len(MUTATIONS) + len(BYTE_MUTATIONS)
    summary = run(kinds, 11, "examples", tmp_path, slow_every=0, jobs=0)
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


def test_reordered_fields_are_the_same_model_to_every_reader(tmp_path):
    data = (artifacts_dir("fc5") / "training_model.onnx").read_bytes()
    mutated, _ = b_reorder_fields(data, random.Random(3))
    assert mutated != data
    assert onnx.load_from_string(mutated) == onnx.load_from_string(data)
    (tmp_path / "m.onnx").write_bytes(mutated)
    assert ort_refuses(tmp_path / "m.onnx") is None


def test_the_judge_sees_each_failure_class(tmp_path):
    """The fuzzer can fail: a command that raises, prints an internal error, exits 0 or writes a
    file on a refused model, or writes a graph onnxruntime refuses, is each caught."""

    @click.command()
    @click.argument("how")
    @click.option("-o", "out")
    def fake(how, out):
        if how == "raise":
            raise ValueError("boom")
        if how == "internal":
            click.echo("error: internal error: ValueError: boom", err=True)
            raise SystemExit(2)
        if how in ("write", "write-bad"):
            (tmp_path / "out" / "x.onnx").write_bytes(b"not a model" if how == "write-bad" else b"")
            raise SystemExit(1 if how == "write" else 0)

    def judge(how, refused):
        return run_command(CliRunner(), fake, [how, "-o", "o"], refused, tmp_path / "out").outcome

    assert judge("raise", None) == "traceback"
    assert judge("internal", "refused") == "internal"
    assert judge("exit0", "refused") == "accepted"
    assert judge("write", "refused") == "accepted"
    assert judge("write-bad", None) == "wrote-refused"
    assert judge("exit0", None) == "ok"
