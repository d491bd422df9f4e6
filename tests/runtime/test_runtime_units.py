"""onnx_remat.runtime pieces that need no onnxruntime session: feeds, log parsing, the rewrite
check, output comparison, and the CUDA path's discovery and errors."""

from __future__ import annotations

import json
import os
import stat
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_remat.errors import EnvironmentProblem, RematError
from onnx_remat.graph import tags
from onnx_remat.runtime import cuda
from onnx_remat.runtime.compare import compare_outputs, max_abs_diff, outputs_equal
from onnx_remat.runtime.inputs import (
    BUFFER,
    DATA,
    PARAMETER,
    classify_inputs,
    infer_int_ranges,
    load_arrays,
    prepare_feeds,
    save_arrays,
)
from onnx_remat.runtime.kept import check_rewrite, clone_of, execution_order
from onnx_remat.runtime.memory import Fd2Capture, parse_arena_log


def _training_like(batch="batch", vocab=50, classes=7) -> onnx.ModelProto:
    """A graph with the input roles of a generate_artifacts training graph (not runnable training)."""
    f = TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("ids", TensorProto.INT64, [batch, 4]),
        helper.make_tensor_value_info("labels", TensorProto.INT64, [batch]),
        helper.make_tensor_value_info("x", f, [batch, 3]),
        helper.make_tensor_value_info("emb", f, [vocab, 8]),
        helper.make_tensor_value_info("w", f, [8, classes]),
        helper.make_tensor_value_info("emb_grad.accumulation.buffer", f, [vocab, 8]),
        helper.make_tensor_value_info("w_grad.accumulation.buffer", f, [8, classes]),
        helper.make_tensor_value_info("lazy_reset_grad", TensorProto.BOOL, [1]),
    ]
    nodes = [
        helper.make_node("Reshape", ["ids", "shape"], ["flat"]),
        helper.make_node("Gather", ["emb", "flat"], ["e"]),
        helper.make_node("MatMul", ["e", "w"], ["scores"]),
        helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        [helper.make_tensor_value_info("loss", f, [])],
        [numpy_helper.from_array(np.array([-1], np.int64), "shape")],
        value_info=[helper.make_tensor_value_info("scores", f, [batch, classes])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


# -- inputs --------------------------------------------------------------------------------------


def test_classify_inputs_by_role():
    roles = classify_inputs(_training_like())
    assert [g.name for g in roles.data] == ["ids", "labels", "x"]
    assert [g.name for g in roles.parameters] == ["emb", "w"]
    assert {g.role for g in roles.data} == {DATA}
    assert {g.role for g in roles.parameters} == {PARAMETER}
    assert {g.role for g in roles.buffers} == {BUFFER}
    assert [g.name for g in roles.flags] == ["lazy_reset_grad"]


def test_int_ranges_from_gather_and_cross_entropy():
    model = _training_like(batch=4)
    ranges = infer_int_ranges(model, classify_inputs(model).data)
    assert ranges["ids"][0] == (0, 50)  # rows of the embedding table, through a Reshape
    assert ranges["labels"][0] == (0, 7)  # classes of the scores
    assert "x" not in ranges


def test_missing_dims_listed_with_hint():
    with pytest.raises(RematError) as err:
        prepare_feeds(_training_like(), synthesize_parameters=True)
    msg = str(err.value)
    assert "batch" in msg and "--dim batch=" in msg and "\n" not in msg


def test_feeds_are_deterministic_and_in_range():
    model = _training_like()
    a = prepare_feeds(model, dims={"batch": 32}, seed=3, synthesize_parameters=True)
    b = prepare_feeds(model, dims={"batch": 32}, seed=3, synthesize_parameters=True)
    c = prepare_feeds(model, dims={"batch": 32}, seed=4, synthesize_parameters=True)
    for name in a.arrays:
        assert np.array_equal(a.arrays[name], b.arrays[name])
    assert not np.array_equal(a.arrays["x"], c.arrays["x"])
    assert a.arrays["ids"].shape == (32, 4) and a.arrays["ids"].dtype == np.int64
    assert a.arrays["ids"].min() >= 0 and a.arrays["ids"].max() < 50
    assert a.arrays["labels"].min() >= 0 and a.arrays["labels"].max() < 7
    assert a.buffers == {"emb_grad.accumulation.buffer": "emb", "w_grad.accumulation.buffer": "w"}
    assert a.from_checkpoint == []
    assert prepare_feeds(model, dims={"batch": 2}).from_checkpoint == ["emb", "w"]


def test_int_range_override_and_bad_name():
    model = _training_like()
    feeds = prepare_feeds(model, dims={"batch": 64}, int_ranges={"ids": (5, 6)}, synthesize_parameters=True)
    assert set(np.unique(feeds.arrays["ids"])) == {5}
    assert feeds.info["ids"].int_range == (5, 6)
    with pytest.raises(RematError, match="integer inputs: ids, labels"):
        prepare_feeds(model, dims={"batch": 2}, int_ranges={"idz": (0, 3)})
    with pytest.raises(RematError, match="low must be below high"):
        prepare_feeds(model, dims={"batch": 2}, int_ranges={"ids": (3, 3)})


def test_inputs_file_checked(tmp_path):
    model = _training_like()
    good = {"ids": np.zeros((5, 4), np.int64), "labels": np.zeros(5, np.int64), "x": np.zeros((5, 3), np.float32)}
    np.savez(tmp_path / "good.npz", **good)
    feeds = prepare_feeds(model, inputs=tmp_path / "good.npz")
    assert feeds.dims == {"batch": 5}  # bound from the arrays, no --dim needed
    assert feeds.info["x"].source == "file"

    cases = {
        "names": ({**good, "idz": good["ids"]}, "no graph input named 'idz'"),
        "missing": ({k: v for k, v in good.items() if k != "x"}, "lacks data input x"),
        "shape": ({**good, "x": np.zeros((5, 4), np.float32)}, "'x' has shape (5, 4), the graph wants (batch, 3)"),
        "rank": ({**good, "x": np.zeros(5, np.float32)}, "1 dimensions"),
        "dtype": ({**good, "x": good["x"].astype(np.float64)}, "'x' is float64, the graph wants float32"),
        "symbol": ({**good, "labels": np.zeros(6, np.int64)}, "batch=6"),
    }
    for name, (arrays, expected) in cases.items():
        np.savez(tmp_path / f"{name}.npz", **arrays)
        with pytest.raises(RematError) as err:
            prepare_feeds(model, inputs=tmp_path / f"{name}.npz")
        assert expected in str(err.value), name
        assert "\n" not in str(err.value)
    (tmp_path / "junk.npz").write_text("not a zip")
    with pytest.raises(RematError, match="not an .npz"):
        prepare_feeds(model, inputs=tmp_path / "junk.npz")
    with pytest.raises(RematError, match="no such file"):
        prepare_feeds(model, inputs=tmp_path / "absent.npz")


def test_arrays_roundtrip_with_any_name(tmp_path):
    arrays = {"onnx::loss::2": np.float32(1.5).reshape(()), "a/b_grad": np.arange(6).reshape(2, 3)}
    back = load_arrays(save_arrays(tmp_path / "o.npz", arrays))
    assert list(back) == list(arrays)
    for k in arrays:
        assert np.array_equal(back[k], arrays[k]) and back[k].dtype == arrays[k].dtype


# -- memory log ----------------------------------------------------------------------------------

_LOG = """\
2026 [I:onnxruntime:Default, bfc_arena.cc:29 BFCArena] Creating BFCArena for Cpu with following configs: x
2026 [I:onnxruntime:Default, bfc_arena.cc:347 AllocateRawInternal] Extending BFCArena for Cpu. bin_num:0 (requested) num_bytes: 8 (actual) rounded_bytes:256
2026 [I:onnxruntime:Default, bfc_arena.cc:206 Extend] Extended allocation by 256 bytes.
2026 [I:onnxruntime:Default, bfc_arena.cc:209 Extend] Total allocated bytes: 256
2026 [I:onnxruntime:Default, bfc_arena.cc:347 AllocateRawInternal] Extending BFCArena for CudaPinned. bin_num:3 (requested) num_bytes: 9999999 (actual) rounded_bytes:9999999
2026 [I:onnxruntime:Default, bfc_arena.cc:209 Extend] Total allocated bytes: 9999999
2026 [I:onnxruntime:Default, bfc_arena.cc:347 AllocateRawInternal] Extending BFCArena for Cpu. bin_num:20 (requested) num_bytes: 225443840 (actual) rounded_bytes:225443840
2026 [I:onnxruntime:Default, bfc_arena.cc:209 Extend] Total allocated bytes: 225444096
"""


def test_parse_arena_log_per_arena():
    cpu = parse_arena_log(_LOG, "Cpu")
    assert cpu.requested == [8, 225443840]
    assert cpu.largest_request == 225443840
    assert cpu.total == 225444096
    pinned = parse_arena_log(_LOG, "CudaPinned")
    assert pinned.largest_request == 9999999 and pinned.total == 9999999
    assert parse_arena_log(_LOG, "Cuda").largest_request is None


def test_fd2_capture(tmp_path):
    with Fd2Capture(tmp_path / "log.txt") as cap:
        os.write(2, b"first\n")
        mark = cap.mark()
        os.write(2, b"second\n")
        assert cap.text(mark) == "second\n"
        assert cap.text(0, mark) == "first\n"


# -- rewrite check -------------------------------------------------------------------------------


def _rewritten_graph() -> onnx.ModelProto:
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="/b/Relu"),
        helper.make_node("Neg", ["a"], ["loss_in"], name="/b/Neg"),
        helper.make_node("ReduceSum", ["loss_in"], ["loss"], name="/loss/ReduceSum", keepdims=0),
        helper.make_node("Neg", ["g"], ["a_grad"], name="/b/Neg_Grad/Neg_0"),
        helper.make_node(
            "PassThrough",
            ["x", "a_grad"],
            ["x/remat_gate/b", "a_grad/remat_gate/b"],
            name=tags.barrier_name("b"),
            domain="com.microsoft",
        ),
        helper.make_node("Relu", ["x/remat_gate/b"], ["a/remat"], name="/b/Relu/remat"),
        helper.make_node("Mul", ["a/remat", "a_grad"], ["x_grad"], name="/b/Relu_Grad/Mul_0"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", f, [4]), helper.make_tensor_value_info("g", f, [4])],
        [helper.make_tensor_value_info("loss", f, []), helper.make_tensor_value_info("x_grad", f, [4])],
    )
    model = helper.make_model(graph, ir_version=8)
    plan = [{"label": "b", "barrier": tags.barrier_name("b"), "triggers": ["a_grad"], "clones": ["/b/Relu/remat"]}]
    helper.set_model_props(model, {tags.PLAN_KEY: json.dumps(plan)})
    return model


def _profile(path, names):
    events = [{"cat": "Session", "name": "model_run", "ts": 0}]
    for i, n in enumerate(names):
        events.append({"cat": "Node", "name": f"{n}_fence_before", "ts": 10 * i + 1})
        events.append({"cat": "Node", "name": f"{n}_kernel_time", "ts": 10 * i + 2})
    path.write_text(json.dumps(events))
    return path


def test_clone_of_fused_names():
    assert clone_of("/b/MatMul/remat") == "/b/MatMul/remat"
    assert clone_of("/b/MatMul/remat/MatMulScaleFusion/") == "/b/MatMul/remat"
    assert clone_of("/b/MatMul") is None


def test_rewrite_check_late_and_early(tmp_path):
    model = _rewritten_graph()
    opt = tmp_path / "opt.onnx"
    onnx.save(model, str(opt))
    late = [
        "/b/Relu",
        "/b/Neg",
        "/b/Neg_Grad/Neg_0",
        tags.barrier_name("b"),
        "/b/Relu/remat",
        "/b/Relu_Grad/Mul_0",
        "/loss/ReduceSum",
    ]
    assert execution_order(_profile(tmp_path / "p.json", late)) == late
    check = check_rewrite(model, opt, tmp_path / "p.json")
    assert (check.clones_in_model, check.clones_kept, check.barriers_in_model, check.barriers_kept) == (1, 1, 1, 1)
    assert check.forward_end_node == "/b/Neg"  # the loss node (run last, read by nobody) is no marker
    (seg,) = check.segments
    assert seg.trigger_nodes == ["/b/Neg_Grad/Neg_0"]
    assert seg.ran_after_trigger is True and seg.ran_after_forward is True and check.all_late

    early = [
        "/b/Relu",
        "/b/Relu/remat",
        "/b/Neg",
        "/b/Neg_Grad/Neg_0",
        tags.barrier_name("b"),
        "/b/Relu_Grad/Mul_0",
        "/loss/ReduceSum",
    ]
    check = check_rewrite(model, opt, _profile(tmp_path / "q.json", early))
    assert check.segments[0].ran_after_trigger is False and check.segments[0].ran_after_forward is False

    # onnxruntime merged the clone away: nothing kept, nothing ran
    merged = onnx.ModelProto()
    merged.CopyFrom(model)
    del merged.graph.node[5]
    onnx.save(merged, str(opt))
    check = check_rewrite(model, opt, _profile(tmp_path / "r.json", [n for n in late if "remat" not in n]))
    assert check.clones_kept == 0 and check.segments[0].clones_ran == 0
    assert check.segments[0].ran_after_trigger is None
    assert check_rewrite(model, None, None).clones_kept is None


# -- output comparison ---------------------------------------------------------------------------


def test_outputs_equal_bitwise_and_tolerance():
    a = np.array([1.0, -0.0, 3.0], np.float32)
    assert outputs_equal(a, a.copy())
    assert not outputs_equal(a, np.array([1.0, 0.0, 3.0], np.float32))  # -0.0 is another bit pattern
    b = a + np.float32(1e-6)
    assert not outputs_equal(a, b)
    assert outputs_equal(a, b, atol=1e-5)
    assert outputs_equal(a, a * (1 + 1e-7), rtol=1e-6)
    assert not outputs_equal(a, a.astype(np.float64))
    assert max_abs_diff(a, np.zeros(4, np.float32)) is None
    assert max_abs_diff(np.array([np.nan]), np.array([1.0])) == float("inf")
    equal, diffs, _, only_a, only_b = compare_outputs({"l": a, "g": a}, {"l": a, "h": a})
    assert not equal and only_a == ["g"] and only_b == ["h"] and diffs["l"] == 0.0


# -- CUDA path -----------------------------------------------------------------------------------


def _fake_site(root, packages):
    for pkg, libs in packages.items():
        lib = root / "nvidia" / pkg / "lib"
        lib.mkdir(parents=True)
        for name in libs:
            (lib / name).write_bytes(b"")
    return root


def test_nvidia_library_dirs_found_in_fake_site_packages(tmp_path):
    site_a = _fake_site(tmp_path / "a", {"cublas": ["libcublas.so.11"], "cudnn": ["libcudnn.so.8"], "empty": []})
    site_b = _fake_site(tmp_path / "b", {"cuda_runtime": ["libcudart.so.11.0"]})
    (tmp_path / "a" / "nvidia" / "__init__.py").write_text("")
    dirs = cuda.nvidia_library_dirs([site_a, site_b, tmp_path / "missing"])
    assert dirs == [site_a / "nvidia/cublas/lib", site_a / "nvidia/cudnn/lib", site_b / "nvidia/cuda_runtime/lib"]
    env = cuda.worker_environment({"LD_LIBRARY_PATH": "/opt/x", "PATH": "/bin"}, [site_a, site_b])
    parts = env["LD_LIBRARY_PATH"].split(os.pathsep)
    assert parts == [str(d) for d in dirs] + ["/opt/x"]
    assert env["PATH"] == "/bin"
    assert cuda.nvidia_library_dirs([tmp_path / "missing"]) == []


def test_cuda_build_missing_is_environment_problem():
    if cuda.installed_runtime() and cuda.installed_runtime()[0] == cuda.CUDA_DISTRIBUTION:
        pytest.skip("the CUDA build is installed here")
    with pytest.raises(EnvironmentProblem) as err:
        cuda.check_cuda_build()
    assert err.value.exit_code == 3
    assert "CUDA build" in str(err.value) and "onnx-remat[cuda]" in str(err.value)


def test_no_gpu_is_environment_problem(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EnvironmentProblem, match="nvidia-smi not found"):
        cuda.check_gpu()
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'\nexit 9\n"
    )
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(EnvironmentProblem, match="could not communicate"):
        cuda.check_gpu()


def test_provider_failure_message_reads_log():
    log = (
        "2026 [I:onnxruntime:, x] fine\n"
        "2026 [E:onnxruntime:Default, provider_bridge_ort.cc:1745 TryGetProviderInfo_CUDA] "
        "Failed to load library libonnxruntime_providers_cuda.so with error: libcublasLt.so.11: "
        "cannot open shared object file\n"
    )
    msg = cuda.provider_failure_message(log)
    assert msg.startswith("the CUDA provider failed to load; Failed to load library")
    assert "\n" not in msg


def test_worker_env_puts_package_on_path():
    from onnx_remat.runtime.measure import worker_env

    env = worker_env("cpu", {"X_TEST": "1"})
    assert env["X_TEST"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(__import__("pathlib").Path(__file__).resolve().parents[2])
    assert sys.executable  # the worker runs with this interpreter


def test_rewrite_check_trigger_behind_removed_identity(tmp_path):
    # onnxruntime removes Identity nodes: a trigger produced by one exists once its input does
    model = _rewritten_graph()
    for node in model.graph.node:
        if node.name == "/b/Neg_Grad/Neg_0":
            node.output[0] = "a_grad0"
    model.graph.node.insert(4, helper.make_node("Identity", ["a_grad0"], ["a_grad"], name="/b/Neg_Grad/Identity_1"))
    order = ["/b/Relu", "/b/Neg", "/b/Neg_Grad/Neg_0", tags.barrier_name("b"), "/b/Relu/remat", "/b/Relu_Grad/Mul_0"]
    check = check_rewrite(model, None, _profile(tmp_path / "p.json", order))
    (seg,) = check.segments
    assert seg.trigger_nodes == ["/b/Neg_Grad/Neg_0"] and seg.trigger_position == 2
    assert seg.ran_after_trigger is True
