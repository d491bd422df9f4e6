"""``onnx_remat.runtime.gate`` and ``onnx-remat check``: the regression gate.

On a small synthetic training graph (benchmarks/synthetic.py: 4 residual blocks with dropout,
~1.5 s per check): passes when nothing changed; fails (exit 1) when a model change raises the
planned peak (a variant with twice the batch, or a baseline recorded with a lower peak) and when
the rewrite's gradients stop matching (a rewrite without the dropout replay, injected through
``apply_fn`` or, for the real console script, through a ``sitecustomize`` that patches
``RecomputeRewrite``); exit 2 for a missing baseline, bad thresholds or another selection; exit 3
for ``--device cuda`` without a GPU. Also checks the committed baselines in models/baselines/.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, assert_one_line_error

SCOPE = "blocks.*"
BASELINES = ROOT / "models" / "baselines"

SITECUSTOMIZE = """
import os
if os.environ.pop("ONNX_REMAT_TEST_FAULT", None) == "no-dropout-replay":
    import onnx_remat.remat.rewrite as _r
    _init = _r.RecomputeRewrite.__init__
    def _faulty(self, **kwargs):
        _init(self, **dict(kwargs, replay_dropout=False))
    _r.RecomputeRewrite.__init__ = _faulty
"""


def wrong_apply(model, *, scopes=None, op_types=None, nodes=None, recompute_outputs=False, dims=None):
    """onnx_remat.remat.apply with a rewrite that re-runs Dropout instead of replaying its mask."""
    from onnx_remat.analysis.model import analyze_model
    from onnx_remat.remat.apply import ApplyResult, plan
    from onnx_remat.remat.rewrite import RecomputeRewrite

    analysis = analyze_model(model, dims=dims)
    p = plan(analysis, scopes=scopes, op_types=op_types, nodes=nodes, recompute_outputs=recompute_outputs)
    rewrite = RecomputeRewrite(replay_dropout=False)(analysis.graph, p)
    return ApplyResult(model=rewrite.model, plan=p, rewrite=rewrite, analysis=analysis)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from benchmarks.synthetic import training_artifacts

    return training_artifacts(4, tmp_path_factory.mktemp("check-model"), batch=32, seq=64, width=64)


@pytest.fixture(scope="module")
def bigger_model_dir(tmp_path_factory) -> Path:
    """The same network with twice the batch: every activation twice as big."""
    from benchmarks.synthetic import training_artifacts

    return training_artifacts(4, tmp_path_factory.mktemp("check-bigger"), batch=64, seq=64, width=64)


@pytest.fixture(scope="module")
def recorded(model_dir, tmp_path_factory) -> Path:
    """A baseline of ``model_dir`` recorded with the library."""
    from onnx_remat.runtime.gate import check

    path = tmp_path_factory.mktemp("check-baseline") / "baseline.json"
    v = check(model_dir, scopes=SCOPE, baseline=path, update=True)
    assert v.passed and v.baseline_updated
    return path


@pytest.fixture
def baseline(recorded, tmp_path) -> Path:
    """A private copy of the recorded baseline, for tests that edit it."""
    out = tmp_path / "baseline.json"
    shutil.copy2(recorded, out)
    return out


def _gated(v):
    return {c.name: c.status for c in v.checks if c.gated}


# -- the library ---------------------------------------------------------------------------------


def test_recorded_baseline_has_the_documented_fields(recorded, model_dir):
    data = json.loads(recorded.read_text())
    assert data["schema"] == "onnx-remat-baseline/1"
    assert data["selection"] == {"scopes": [SCOPE], "op_types": [], "nodes": [], "recompute_outputs": False}
    assert data["device"] == "cpu" and data["onnxruntime"] == "1.19.2"
    f = data["figures"]
    assert f["gradients_equal"] is True
    assert f["segments"] == 4 and f["barriers"] == 4 and f["barriers_kept"] == 4
    assert 0 < f["rewritten_planned_peak_bytes"] < f["original_planned_peak_bytes"]
    assert f["clones_kept"] <= f["clones"]
    assert not [p for p in recorded.parent.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_passes_when_nothing_changed(model_dir, baseline):
    from onnx_remat.runtime.gate import check

    v = check(model_dir, scopes=SCOPE, baseline=baseline)
    assert v.passed, [c.to_json() for c in v.failures]
    gated = _gated(v)
    assert gated["gradients"] == gated["original_planned_peak"] == gated["rewritten_planned_peak"] == "PASS"
    assert gated["clones"] == gated["clones_kept"] == gated["barriers_kept"] == "PASS"
    assert not v.checks[[c.name for c in v.checks].index("step_time_ratio")].gated  # timing not gated by default
    data = v.to_json()
    assert data["schema"] == "onnx-remat-check/1" and data["result"] == "PASSED" and data["failures"] == []
    assert data["thresholds"]["max_peak_increase"] == 0.02


def test_selection_defaults_to_the_baselines(model_dir, baseline):
    from onnx_remat.runtime.gate import check

    v = check(model_dir, baseline=baseline)
    assert v.selection["scopes"] == [SCOPE] and v.passed


def test_wrong_rewrite_fails_on_gradients_and_is_not_recorded(model_dir, baseline, tmp_path):
    from onnx_remat.runtime.gate import check

    v = check(model_dir, scopes=SCOPE, baseline=baseline, apply_fn=wrong_apply)
    assert not v.passed
    assert _gated(v)["gradients"] == "FAIL"
    assert "different results" in v.diagnosis[0]

    fresh = tmp_path / "new.json"
    v = check(model_dir, scopes=SCOPE, baseline=fresh, update=True, apply_fn=wrong_apply)
    assert not v.passed and not v.baseline_updated and not fresh.exists()
    assert any("baseline not written" in d for d in v.diagnosis)


def test_time_is_gated_only_with_check_time(model_dir, baseline):
    from onnx_remat.runtime.gate import check

    data = json.loads(baseline.read_text())
    data["figures"]["step_time_ratio"] = 0.01  # a recompute that once cost nothing
    baseline.write_text(json.dumps(data))
    assert check(model_dir, scopes=SCOPE, baseline=baseline, steps=1).passed
    v = check(model_dir, scopes=SCOPE, baseline=baseline, check_time=True, steps=1)
    assert not v.passed and [c.name for c in v.failures] == ["step_time_ratio"]


def test_update_accepts_a_model_change(bigger_model_dir, baseline):
    from onnx_remat.runtime.gate import check

    before = json.loads(baseline.read_text())["figures"]["original_planned_peak_bytes"]
    v = check(bigger_model_dir, scopes=SCOPE, baseline=baseline, update=True)
    assert v.passed and v.baseline_updated and not v.failures
    peak = next(c for c in v.checks if c.name == "original_planned_peak")
    assert peak.status == "INFO" and "accepted by --update-baseline" in peak.message
    assert json.loads(baseline.read_text())["figures"]["original_planned_peak_bytes"] > before
    assert check(bigger_model_dir, scopes=SCOPE, baseline=baseline).passed


@pytest.mark.parametrize("value", [-0.01, float("nan"), "abc"])
def test_bad_thresholds_are_usage_errors(model_dir, baseline, value):
    from onnx_remat.errors import UsageError
    from onnx_remat.runtime.gate import check

    with pytest.raises(UsageError):
        check(model_dir, scopes=SCOPE, baseline=baseline, max_peak_increase=value)


# -- the command line ----------------------------------------------------------------------------


def test_cli_passes(cli, model_dir, baseline, tmp_path):
    out = tmp_path / "verdict.json"
    proc = cli("check", model_dir, "--scope", SCOPE, "--baseline", baseline, "--json", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASSED" in proc.stdout and "planned peak, rewritten" in proc.stdout
    data = json.loads(out.read_text())
    assert data["passed"] is True and data["baseline"] == str(baseline)
    assert {c["name"] for c in data["checks"]} >= {
        "gradients",
        "original_planned_peak",
        "rewritten_planned_peak",
        "clones",
        "clones_kept",
        "barriers_kept",
        "step_time_ratio",
    }
    assert data["comparison"]["equal"] is True


def test_cli_fails_when_the_model_grows(cli, bigger_model_dir, baseline):
    proc = cli("check", bigger_model_dir, "--scope", SCOPE, "--baseline", baseline, "--json", "-")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert data["result"] == "FAILED"
    assert set(data["failures"]) == {"original_planned_peak", "rewritten_planned_peak"}
    assert "the model changed" in " ".join(data["diagnosis"])
    assert "FAILED" in proc.stderr  # with --json -, the table and verdict go to stderr


def test_cli_fails_when_the_rewritten_peak_rose(cli, model_dir, baseline):
    data = json.loads(baseline.read_text())
    data["figures"]["rewritten_planned_peak_bytes"] = int(data["figures"]["rewritten_planned_peak_bytes"] * 0.9)
    baseline.write_text(json.dumps(data))
    proc = cli("check", model_dir, "--scope", SCOPE, "--baseline", baseline)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED" in proc.stdout and "planned peak, rewritten" in proc.stdout.split("FAILED")[-1]
    assert "only the rewritten graph's planned peak rose" in proc.stdout.replace("\n", " ")
    # a looser threshold lets it pass
    proc = cli("check", model_dir, "--scope", SCOPE, "--baseline", baseline, "--max-peak-increase", "20%")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_cli_fails_when_gradients_stop_matching(cli, model_dir, baseline, tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    proc = cli(
        "check",
        model_dir,
        "--scope",
        SCOPE,
        "--baseline",
        baseline,
        env={"PYTHONPATH": str(hook), "ONNX_REMAT_TEST_FAULT": "no-dropout-replay"},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    tail = proc.stdout.split("FAILED")[-1]
    assert "loss and gradients equal" in tail
    assert "different results" in proc.stdout.replace("\n", " ")


def test_cli_update_baseline_writes_it(cli, model_dir, tmp_path):
    path = tmp_path / "sub" / "b.json"
    proc = cli("check", model_dir, "--scope", SCOPE, "--baseline", path, "--update-baseline")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "baseline written" in proc.stdout
    assert json.loads(path.read_text())["figures"]["gradients_equal"] is True


def test_cli_missing_baseline_is_a_usage_error(cli, model_dir, tmp_path):
    proc = cli("check", model_dir, "--scope", SCOPE, "--baseline", tmp_path / "none.json")
    assert_one_line_error(proc, "no such baseline", "--update-baseline", code=2)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--max-peak-increase", "abc"], "not a percentage"),
        (["--max-peak-increase", "-2%"], "--max-peak-increase -2%: give a finite percentage >= 0"),
        (["--max-time-increase", "25"], "write 25%"),
    ],
)
def test_cli_bad_thresholds_exit_2(cli, model_dir, baseline, args, fragment):
    proc = cli("check", model_dir, "--scope", SCOPE, "--baseline", baseline, *args)
    assert_one_line_error(proc, fragment, code=2)


def test_cli_other_selection_is_a_usage_error(cli, model_dir, baseline):
    proc = cli("check", model_dir, "--scope", "blocks.0", "--baseline", baseline)
    assert_one_line_error(proc, "was recorded for --scope blocks.*", code=2)


def test_cli_cuda_without_gpu_exits_3(cli, model_dir, baseline):
    proc = cli("check", model_dir, "--scope", SCOPE, "--baseline", baseline, "--device", "cuda")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


# -- the committed baselines ---------------------------------------------------------------------


def test_every_model_has_a_committed_baseline():
    from models import MODELS
    from onnx_remat.runtime.gate import read_baseline

    for name, spec in MODELS.items():
        data = read_baseline(BASELINES / f"{name}.json")
        assert data["selection"]["scopes"] == [spec.block_scope], name
        assert data["model"] == f"models/artifacts/{name}"
        f = data["figures"]
        assert f["gradients_equal"] is True
        assert f["rewritten_planned_peak_bytes"] < f["original_planned_peak_bytes"], name
