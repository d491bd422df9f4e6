"""Graph pictures: what the view holds, DOT always, SVG/PNG through Graphviz, and bad input via the CLI."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from conftest import artifacts_dir, assert_one_line_error

from onnx_remat.show.graph_view import graph_view, to_dot, write_graph

needs_dot = pytest.mark.skipif(
    shutil.which("dot") is None, reason="Graphviz's dot is not installed (apt-get install graphviz)"
)


@pytest.fixture(scope="module")
def after_view():
    return graph_view(artifacts_dir("blocks10"), scopes=["Block"], expand=2)


def test_view_of_the_rewrite(after_view):
    view = after_view
    assert view.rewritten and list(view.clusters) == ["blocks.0", "blocks.1"]
    kinds = {n.kind for n in view.nodes}
    assert kinds == {"forward", "backward", "clone", "barrier", "collapsed"}
    expanded = [n for n in view.nodes if n.kind != "collapsed"]
    assert {n.unit for n in expanded} == {"blocks.0", "blocks.1"}
    assert sum(n.kind == "barrier" for n in view.nodes) == 2
    assert sum(n.kind == "clone" for n in view.nodes) == 20 + 2 * 3  # and the nodes unpacking the dropout masks
    styles = {e.style for e in view.edges}
    assert {"rewired", "barrier"} <= styles and "replaced" not in styles
    # blocks.2 .. blocks.9 are one box, and the view says so.
    assert any("8 scopes blocks.2 … blocks.9 (Block) into one box" in c for c in view.collapsed)
    box = next(n for n in view.nodes if n.id == "box:blocks.2 … blocks.9")
    assert "8 × Block" in box.label and "stores" in box.label


def test_view_before_marks_replaced_edges():
    view = graph_view(artifacts_dir("blocks10"), scopes=["Block"], expand=1, before=True)
    assert not view.rewritten
    assert {n.kind for n in view.nodes} == {"forward", "backward", "collapsed"}
    # blocks.0's two recomputed activations and its dropout mask (stored packed, unpacked again)
    assert sum(e.style == "replaced" for e in view.edges) == 3


def test_dot_text(after_view, tmp_path):
    dot = to_dot(after_view)
    assert dot.startswith("digraph remat {") and dot.rstrip().endswith("}")
    assert dot.count("subgraph cluster_") == 2 + 6  # two scopes, each forward / backward / recompute
    assert "#2f8a3b" in dot and "#7b3fa0" in dot
    out = write_graph(after_view, tmp_path / "g.dot")
    assert out.read_text() == dot


def test_view_focus_and_op_type_selection():
    view = graph_view(artifacts_dir("gpt"), op_types=["Softmax"], expand=1)
    assert view.rewritten and len(view.clusters) == 1
    focused = graph_view(artifacts_dir("gpt"), scopes=["Block"], focus=["blocks.2"])
    assert list(focused.clusters) == ["blocks.2"]


@needs_dot
def test_svg_png_and_html(after_view, tmp_path):
    svg = write_graph(after_view, tmp_path / "g.svg").read_text()
    assert "<svg" in svg and "remat_barrier/blocks.0" in svg
    png = write_graph(after_view, tmp_path / "g.png").read_bytes()
    assert png[:4] == b"\x89PNG"
    page = write_graph(after_view, tmp_path / "g.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "Collapsed" in page


def test_viz_cli(cli, tmp_path):
    out = tmp_path / "g.dot"
    proc = cli("viz", artifacts_dir("blocks10"), "--scope", "Block", "--expand", "1", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "drew blocks.0 in full" in proc.stdout and "collapsed: 9 scopes blocks.1 … blocks.9" in proc.stdout
    assert out.read_text().startswith("digraph")


def test_viz_cli_errors(cli, tmp_path):
    art = artifacts_dir("blocks10")
    assert_one_line_error(cli("viz", art, "--scope", "Nope", "-o", tmp_path / "g.dot"), "matches no scope")
    assert_one_line_error(
        cli("viz", art, "--scope", "Block", "-o", tmp_path / "g.jpg"), "give a .dot, .svg, .png or .html"
    )
    assert_one_line_error(cli("viz", art, "--before", "-o", tmp_path / "g.dot"), "--before needs a selection")
    assert not any(tmp_path.iterdir())


def test_viz_cli_without_graphviz(cli, tmp_path):
    """SVG without Graphviz: one line saying how to install it; HTML falls back to the DOT text, and says so."""
    env = {"PATH": str(Path(sys.executable).parent) + os.pathsep + str(tmp_path / "empty")}
    art = artifacts_dir("fc5")
    proc = cli("viz", art, "--scope", "FCBlock", "-o", tmp_path / "g.svg", env=env)
    assert_one_line_error(proc, "needs Graphviz's `dot`", "apt-get install graphviz")
    assert not (tmp_path / "g.svg").exists()
    page = tmp_path / "g.html"
    ok = cli("viz", art, "--scope", "FCBlock", "-o", page, env=env)
    assert ok.returncode == 0, ok.stderr
    assert "Graphviz's dot is not installed" in ok.stdout
    text = page.read_text()
    assert "digraph remat" in text and "not installed" in text and "<svg" not in text
