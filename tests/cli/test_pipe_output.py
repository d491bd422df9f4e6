"""Output read in a pipe, a file or a CI log: tables keep every cell on one line there (rich would
draw 80 columns and break long scope names mid-word); a terminal gets its own width, and COLUMNS,
when set, is honoured."""

from __future__ import annotations

import os
import subprocess

from conftest import _console_script

from cli.common import PIPE_WIDTH, output_width
from onnx_remat.analysis.model import analyze_model


def test_scopes_of_a_bert_graph_piped_to_a_file_keep_each_name_on_one_line(corpus, tmp_path):
    art = corpus("bert_ts")
    names = [s.path for s in analyze_model(art).scopes.scopes() if len(s.path or "") > 30]
    assert names, "the BERT graph has long scope names (cls.predictions..., bert.encoder.layer.N...)"
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = tmp_path / "scopes.txt"
    with out.open("w") as f:
        proc = subprocess.run(_console_script() + ["scopes", str(art)], stdout=f, stderr=subprocess.PIPE, env=env)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    lines = text.splitlines()
    for name in names:
        assert any(name in line for line in lines), f"{name!r} is not whole on any line"


def test_width_is_the_terminals_or_columns_or_wide(monkeypatch, tmp_path):
    class Tty:
        def isatty(self):
            return True

    monkeypatch.delenv("COLUMNS", raising=False)
    with (tmp_path / "f").open("w") as f:
        assert output_width(f) == PIPE_WIDTH
    assert output_width(Tty()) is None  # rich asks the terminal
    monkeypatch.setenv("COLUMNS", "90")
    with (tmp_path / "f").open("w") as f:
        assert output_width(f) is None  # rich reads COLUMNS
