"""README.md's examples, run in order on a fresh copy of the example models, print what README
shows (timings masked; ``...`` rows left out) and its Python example runs as written after them.
``make readme`` (tests/readme_replay.py --update) rewrites the outputs from a real run."""

from __future__ import annotations

import shutil

from readme_replay import README, matches, normalize, parse, replay, workspace


def test_readme_examples_print_what_readme_shows():
    text = README.read_text()
    steps = parse(text)
    commands = [s.text.split()[1] for s in steps if s.kind == "command"]
    assert {"scopes", "apply", "compare", "estimate", "viz", "check"} <= set(commands), commands
    assert any(s.kind == "python" for s in steps)
    work = workspace()
    try:
        results = replay(text, work)
        assert (work / "blocks10_remat" / "training_model.onnx").exists()
        assert (work / "gpt_softmax_gelu.onnx").exists()
        assert (work / "timeline.png").exists()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    problems = [
        f"$ {step.text}: {problem}\n--- README\n" + "\n".join(step.expected) + "\n--- now\n" + "\n".join(lines)
        for step, lines, problem in results
        if problem
    ]
    assert not problems, "\n\n".join(problems)


def test_matching_masks_timing_and_elisions():
    assert normalize("  step time (median)    248.9 ms   271.0 ms   x1.09") == normalize(
        "  step time (median)  1.021 s   690.4 ms   x0.68"
    )
    assert normalize("PASSED (2.1 s): 9 gated checks") == normalize("PASSED (12.0 s): 9 gated checks")
    assert normalize(" ━━━━ ") == normalize("━━━━━━━━━━")
    assert normalize(" planned peak 215.0 MiB") != normalize(" planned peak 216.0 MiB")
    assert matches(["a", "...", "z"], ["a", "b", "c", "z"])
    assert matches(["a", "...", "z"], ["a", "z"])
    assert not matches(["a", "...", "z"], ["a", "b"])
    assert not matches(["a", "b"], ["a", "b", "c"])
