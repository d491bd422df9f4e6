"""Each command analyses its model once: the rewrite is a functional pass, and apply, estimate,
the graph view and the report pass one analysis along."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from conftest import artifacts_dir

import onnx_remat.analysis.model as model_module
from onnx_remat.cli.main import main


@pytest.fixture
def analyses(monkeypatch):
    """Counts the analyses made (each runs the scope pass exactly once)."""
    calls: list[int] = []
    real = model_module.resolve_scopes

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(model_module, "resolve_scopes", counting)
    return calls


def _run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def test_apply_with_report_analyses_once(analyses, tmp_path):
    _run(
        "apply",
        artifacts_dir("blocks10"),
        "--scope",
        "Block",
        "-o",
        tmp_path / "out",
        "--report",
        tmp_path / "r.html",
        "--json",
        tmp_path / "s.json",
    )
    assert len(analyses) == 1


def test_estimate_with_a_selection_analyses_once(analyses, tmp_path):
    _run("estimate", artifacts_dir("blocks10"), "--scope", "Block", "--json", tmp_path / "e.json")
    assert len(analyses) == 1


def test_report_and_viz_analyse_once(analyses, tmp_path):
    _run("report", artifacts_dir("gpt"), "--scope", "Block", "-o", tmp_path / "r.html")
    assert len(analyses) == 1
    analyses.clear()
    _run("viz", artifacts_dir("gpt"), "--scope", "Block", "-o", tmp_path / "g.dot")
    assert len(analyses) == 1


def test_the_rewrite_leaves_its_analysis_as_it_was():
    from onnx_remat import apply

    analysis = model_module.analyze_model(artifacts_dir("blocks10"))
    before = [(n.name, [t.name for t in n.inputs]) for n in analysis.graph.graph.nodes]
    first = apply(analysis, scopes="Block")
    second = apply(analysis, scopes="Block")
    assert [(n.name, [t.name for t in n.inputs]) for n in analysis.graph.graph.nodes] == before
    assert first.model == second.model  # one analysis serves any number of rewrites
