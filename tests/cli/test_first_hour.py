"""What a new user met in their first hour (issue 13): suggestions, notes, narrow terminals,
where outputs go."""

from __future__ import annotations

import re

from conftest import artifacts_dir


def test_scopes_suggests_the_users_block_not_a_container(cli):
    """resnet's top level is four torch.nn.Sequential (a stem and three stages): the block to
    recompute is BasicBlock, one level down, and the suggestion says so at depth 0 already."""
    proc = cli("scopes", artifacts_dir("resnet"), "--depth", "0")
    assert proc.returncode == 0, proc.stderr
    assert "repeated: layers.0.0 .. layers.2.1 (6 x BasicBlock) -> try --scope BasicBlock" in proc.stdout
    assert "--scope Sequential" not in proc.stdout and "of 4 x Sequential" not in proc.stdout
    stem = next(line for line in proc.stdout.splitlines() if line.lstrip().startswith("stem"))
    assert "x " not in stem.split("│")[-1]  # the stem is not a repeat of the stages
    assert "+N?: N more tensors of unknown size" in proc.stdout  # what "16.0 MiB +8?" means


def test_notes_are_printed_once_and_in_grammar(cli, tmp_path):
    proc = cli("apply", artifacts_dir("resnet"), "--scope", "BasicBlock", "-o", tmp_path / "r")
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stdout.splitlines() if line.startswith("note:")]
    assert notes and len(notes) == len(set(notes)), notes
    # the estimate's note about before and the one about after, said once
    assert proc.stdout.count("onnxruntime learns only at run time") == 1
    assert "note: before and after: " in proc.stdout


def test_counts_in_messages_agree_with_their_nouns():
    from onnx_remat.cli.common import merge_notes
    from onnx_remat.units import plural

    assert plural(1, "activation") == "1 activation" and plural(3, "tensor") == "3 tensors"
    merged = merge_notes(
        [
            "before: 1 activation of unknown size is not counted (x)",
            "after: 1 activation of unknown size is not counted (x)",
            "other",
            "other",
        ]
    )
    assert merged == ["before and after: 1 activation of unknown size is not counted (x)", "other"]


def test_nothing_is_cut_at_80_columns(cli):
    """Names a user copies into --scope or --node are wrapped, never cut with an ellipsis."""
    for args in (("scopes", artifacts_dir("gpt")), ("estimate", artifacts_dir("gpt"), "--scope", "Block")):
        proc = cli(*args, env={"COLUMNS": "80"})
        assert proc.returncode == 0, proc.stderr
        assert "…" not in proc.stdout, proc.stdout
        assert max(len(line) for line in proc.stdout.splitlines()) <= 80


def test_default_output_goes_to_the_current_directory(cli, tmp_path):
    """Not beside the input: models/artifacts/ is scanned by tests and shown by git."""
    proc = cli("apply", artifacts_dir("fc5"), "--scope", "FCBlock", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "fc5_remat" / "training_model.onnx").is_file()
    assert not artifacts_dir("fc5").with_name("fc5_remat").exists()
    assert re.search(r"wrote fc5_remat\b", proc.stdout)
