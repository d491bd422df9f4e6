"""Shared weights' partial gradients made as soon as their call's gradient exists (onnx_remat.scheduling.partials)."""

from __future__ import annotations

import onnx
import pytest

torch = pytest.importorskip("torch")

from conftest import artifacts_dir

import onnx_remat
from onnx_remat.graph import tags
from onnx_remat.graph.toposort import index_order
from onnx_remat.model_io import write_artifacts
from onnx_remat.runtime.compare import compare
from onnx_remat.scheduling.partials import PARTIALS_EARLY, gate_partials
from tests.regressions import CALLS, SharedLayer, make_artifacts


@pytest.fixture(scope="module", params=["torchscript", "dynamo"])
def shared(request, tmp_path_factory):
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp(f"shared_{request.param}")
    opset = 17 if request.param == "torchscript" else 18
    return make_artifacts(SharedLayer(), torch.randn(8, 16), out / "model", exporter=request.param, opset=opset)


def test_partial_gradients_of_a_shared_weight_are_gated_exactly(shared, tmp_path):
    """scheduling/partials.py on the shared layer: each call's partial gradients gate the rest of the
    backward pass, the graph stays sorted and acyclic, the sums keep their inputs, and a step of it
    is bit-identical to the original."""
    model = onnx.load(shared / "training_model.onnx")
    gated = gate_partials(model)
    assert gated is not None and gated.gates >= CALLS - 1
    nodes = list(gated.model.graph.node)
    gates = [n for n in nodes if tags.is_partial_gate_name(n.name)]
    assert len(gates) == gated.gates
    assert all(n.op_type == "PassThrough" and n.domain == "com.microsoft" for n in gates)
    assert all({p.key: p.value for p in n.metadata_props}[tags.ROLE_KEY] == tags.ROLE_PARTIAL_GATE for n in gates)
    reads, writes = [list(n.input) for n in nodes], [list(n.output) for n in nodes]
    assert index_order(reads, writes) == list(range(len(nodes)))  # sorted as written
    sums = {n.name: list(n.input) for n in model.graph.node if n.op_type == "Sum"}
    assert {n.name: list(n.input) for n in nodes if n.op_type == "Sum"} == sums
    assert len(model.graph.node) == len(nodes) - len(gates)  # the input is not changed
    out = write_artifacts(shared, tmp_path / "gated", gated.model)
    c = compare(shared, out, steps=1, warmup=1, live=False)
    assert c.equal, (c.mismatched[:5], c.equality_run)


def test_the_schedule_keeps_gated_partials_only_where_they_lower_the_peak(shared):
    result = onnx_remat.schedule(shared)
    labels = [c.graph for c in result.schedule.candidates]
    assert PARTIALS_EARLY in labels
    if result.schedule.chosen is not None and result.schedule.chosen.graph == PARTIALS_EARLY:
        assert result.schedule.partials_early and any("made as soon as" in n for n in result.schedule.notes)
        assert result.estimate_after.planned_peak_bytes < result.estimate_before.planned_peak_bytes
    else:
        assert not result.schedule.partials_early


def test_graphs_without_a_sum_of_partials_get_no_gate():
    for name in ("blocks10", "gpt"):  # gpt: tied embeddings, left to the accumulation pass
        assert gate_partials(onnx.load(artifacts_dir(name) / "training_model.onnx")) is None
