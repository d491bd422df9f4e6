"""The README's Python example runs as written (from a folder where models/ is reachable)."""

from __future__ import annotations

import os
import re

from conftest import ROOT


def test_readme_python_example_runs(tmp_path):
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no Python example"
    (tmp_path / "models").symlink_to(ROOT / "models")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for block in blocks:
            exec(compile(block, "README.md", "exec"), {})
    finally:
        os.chdir(cwd)
    assert (tmp_path / "blocks10_remat" / "training_model.onnx").exists()
    assert (tmp_path / "gpt_softmax_gelu.onnx").exists()
