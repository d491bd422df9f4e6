"""The HTML report: self-contained, from an ApplyResult or a model, and it renders in a real browser."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
from conftest import artifacts_dir, assert_one_line_error

import onnx_remat
from onnx_remat.show.report import write_report

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


@pytest.fixture(scope="module")
def report_page(tmp_path_factory):
    result = onnx_remat.apply(artifacts_dir("blocks10"), scopes=["Block"])
    return write_report(result, tmp_path_factory.mktemp("report") / "blocks10.html")


def test_report_from_apply_result(report_page):
    text = report_page.read_text()
    assert text.startswith("<!DOCTYPE html>")
    for part in ("Summary", "Memory over one training step", "Scopes", "Segments", "The rewritten region"):
        assert f"<h2>{part}</h2>" in text
    assert "215.0 MiB" in text and "54.2 MiB" in text and "x0.25" in text  # the rewrite, scheduled
    assert text.count("<svg") >= 2 if shutil.which("dot") else text.count("<svg") >= 1
    # Self-contained: nothing to fetch.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//|file:)""", text)
    assert "<script" not in text


def test_report_from_model_path(tmp_path):
    out = write_report(artifacts_dir("fc5"), tmp_path / "fc5.html", scopes=["FCBlock"], expand=1)
    text = out.read_text()
    assert "runfunc0" in text and "after / before" in text


def test_report_cli(cli, tmp_path):
    out = tmp_path / "r.html"
    proc = cli("report", artifacts_dir("fc5"), "--scope", "FCBlock", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert out.exists() and "wrote" in proc.stdout
    assert_one_line_error(
        cli("report", artifacts_dir("fc5"), "--scope", "FCBlock", "-o", tmp_path / "r.pdf"), "give a .html path"
    )
    assert_one_line_error(
        cli("report", artifacts_dir("fc5"), "--scope", "Missing", "-o", tmp_path / "x.html"), "matches no scope"
    )
    assert not (tmp_path / "x.html").exists()


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_report_renders_in_headless_chromium(report_page, tmp_path):
    from matplotlib import image

    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1280,2000",
            report_page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.exists(), proc.stderr[-2000:]
    assert shot.stat().st_size > 50_000
    pixels = image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (2000, 1280)
    not_white = (pixels < 0.95).any(axis=2).mean()
    assert not_white > 0.05, not_white  # text, tables and the plot, not a blank page
    assert float(np.std(pixels)) > 0.05
