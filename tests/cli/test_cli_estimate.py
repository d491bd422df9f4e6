"""``onnx-remat estimate`` through the real console script: output, JSON, plots, bad input."""

from __future__ import annotations

import json

import onnx
from conftest import artifacts_dir, assert_one_line_error


def test_estimate_cli_before_after_json_and_plots(cli, tmp_path):
    out_json = tmp_path / "est.json"
    png = tmp_path / "timeline.png"
    proc = cli("estimate", artifacts_dir("blocks10"), "--scope", "Block", "--json", out_json, "--plot", png)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # rich wraps lines at the terminal's width
    assert "215.0 MiB" in text and "54.2 MiB" in text and "x0.25" in text  # the rewrite, scheduled
    assert "10 dropout masks, 4.2 MiB stored (packed)" in text
    assert "largest tensors alive at the before peak" in proc.stdout
    assert "blocks.9" in proc.stdout and "onnxruntime DEFAULT order" in proc.stdout
    data = json.loads(out_json.read_text())
    assert data["before"]["planned_peak_bytes"] == 225443840 and data["after"]["planned_peak_bytes"] == 56885248
    assert data["selection"]["dropout"] == "packed" and data["selection"]["mask_bytes"] == 9 * 2**18 + 2 * 2**20
    assert len(data["after"]["timeline"]["region"]) == len(data["after"]["timeline"]["live_bytes"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and 10_000 < png.stat().st_size < 300_000


def test_estimate_cli_svg_plot_and_order_file(cli, tmp_path):
    order = tmp_path / "order.json"
    est = cli("estimate", artifacts_dir("fc5"), "--json", "-")
    assert est.returncode == 0, est.stderr
    names = json.loads(est.stdout[est.stdout.index("{") :])["before"]["timeline"]["nodes"]
    order.write_text(json.dumps(names))
    svg = tmp_path / "t.svg"
    proc = cli("estimate", artifacts_dir("fc5"), "--order", order, "--plot", svg)
    assert proc.returncode == 0, proc.stderr
    assert "given order (99 of 99 nodes matched by name)" in " ".join(proc.stdout.split())
    assert svg.read_text().lstrip().startswith(("<?xml", "<svg"))


def test_estimate_cli_errors(cli, tmp_path):
    art = artifacts_dir("fc5")
    assert_one_line_error(cli("estimate", art, "--scope", "NoSuchBlock"), "matches no scope")
    assert_one_line_error(cli("estimate", art, "--plot", tmp_path / "t.gif"), "give a .png or .svg path")
    bad = tmp_path / "order.json"
    bad.write_text('{"not": "an order"}')
    assert_one_line_error(cli("estimate", art, "--order", bad), "neither a JSON list of node names")
    assert_one_line_error(cli("estimate", tmp_path / "missing.onnx"), "no such file")
    assert not (tmp_path / "t.gif").exists()


def test_estimate_cli_symbolic_dims(cli, tmp_path):
    model = onnx.load(artifacts_dir("fc5") / "training_model.onnx")
    dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    batch = dim.dim_value
    dim.ClearField("dim_value")
    dim.dim_param = "batch"
    path = tmp_path / "sym.onnx"
    onnx.save(model, path)
    assert_one_line_error(cli("estimate", path), "symbolic dimensions without a value: batch", "--dim batch=")
    ok = cli("estimate", path, "--dim", f"batch={batch}")
    assert ok.returncode == 0, ok.stderr
    assert "planned peak" in ok.stdout
