"""What recomputing a node costs: per-node compute time of a training graph, measured or estimated.

>>> from onnx_remat.remat.cost import node_costs
>>> costs = node_costs(analysis)                      # a FLOP estimate (nothing runs)
>>> costs = node_costs(analysis, profile="costs.json")  # onnxruntime's profile of the graph
>>> costs.of(node), costs.total, costs.source

Two sources, one unit (seconds per training step):

* **a profile** of the graph run by onnxruntime (:func:`onnx_remat.runtime.profile.profile_costs`
  measures one and caches it beside the model; an onnxruntime profile JSON written with
  ``enable_profiling`` is read too). Kernel times are averaged over the profiled steps and
  mapped back to the training graph's nodes by name: onnxruntime names a fused node after the
  node it was made from (``/blocks.0/MatMul/MatMulScaleFusion/``), so the fused kernel's time goes
  to that node and the nodes fused into it cost nothing, as they do when their clones are fused
  the same way. Nodes the profile does not name get the FLOP estimate, scaled by the profile's
  seconds per estimated second over the nodes it does name.
* **a FLOP estimate** where no profile is given: a roofline per node, the larger of its
  arithmetic (2 x multiply-adds for matrix products and convolutions, a few operations per
  element for the rest) at :data:`FLOPS` and the bytes it reads and writes at :data:`BANDWIDTH`.
  Only ratios matter to the planner (which node is dearer to recompute); the absolute figure is
  a rough single-core CPU.

``costs.total`` is the whole step (every node), so ``cost / costs.total`` is the step time a
recompute adds, as a fraction.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import onnx_graphsurgeon as gs

from onnx_remat.errors import RematError
from onnx_remat.ortsim.graph import element_count

# Rough CPU figures, fitted to onnxruntime's profiles of the example models (matrix products and
# convolutions within ~x1.4, element-wise kernels within ~x3): only ratios matter to the planner.
FLOPS = 20e9  # floating-point operations per second
BANDWIDTH = 3e9  # bytes per second read or written
MATMULS = frozenset({"MatMul", "FusedMatMul", "TransposeMatMul", "Gemm", "MatMulInteger", "FusedGemm"})
CONVS = frozenset({"Conv", "ConvTranspose", "FusedConv", "ConvGrad"})
# Element-wise operations per output element beyond one (transcendentals, normalisations).
_OPS_PER_ELEMENT = {
    "Softmax": 5,
    "LogSoftmax": 5,
    "LayerNormalization": 8,
    "SimplifiedLayerNormalization": 6,
    "SkipLayerNormalization": 9,
    "BatchNormalization": 6,
    "BatchNormInternal": 8,
    "Gelu": 40,
    "FastGelu": 30,
    "BiasGelu": 40,
    "Erf": 8,
    "Tanh": 6,
    "Sigmoid": 4,
    "Exp": 4,
    "Log": 4,
    "Pow": 4,
    "Sqrt": 2,
    "Div": 2,
    "Dropout": 40,  # the random draw
    "BitmaskDropout": 40,
}
FLOPS_SOURCE = "flops"
PROFILE_SUFFIX = ".remat-profile.json"  # cached profile beside a training graph: <graph>.remat-profile.json
_KERNEL_SUFFIX = "_kernel_time"
_FUSION_SUFFIX = re.compile(r"(?:/[A-Za-z0-9]+Fusion/)+$")
_TOKEN_SUFFIX = re.compile(r"_token_\d+$")


@dataclass
class NodeCosts:
    """Seconds per training step of each node of one training graph (by node name)."""

    seconds: dict[str, float]
    source: str  # "profile" or "flops"
    detail: str = ""  # where the figures come from, for reports
    unmatched: list[str] = field(default_factory=list)  # nodes the profile did not name (fused away)
    replay: dict[str, float] = field(default_factory=dict)  # Dropout name -> cost of replaying its mask

    @property
    def total(self) -> float:
        """The whole step: every node's cost."""
        return float(sum(self.seconds.values()))

    def of(self, node: gs.Node) -> float:
        """Seconds one run of ``node`` costs (0 for a node the graph does not have)."""
        return self.seconds.get(node.name, 0.0)

    def recompute_of(self, node: gs.Node) -> float:
        """Seconds a clone of ``node`` costs: a training-mode Dropout is replayed from its mask with
        a ``DropoutGrad`` (:mod:`onnx_remat.remat.random_ops`), which costs what the gradient
        node of the same Dropout does, not the random draw."""
        replay = self.replay.get(node.name)
        return replay if replay is not None else self.of(node)

    def recompute_sum(self, nodes: Iterable[gs.Node]) -> float:
        """Seconds the clones of ``nodes`` cost."""
        return float(sum(self.recompute_of(n) for n in nodes))


def _numel(sizes, name: str) -> int:
    shape = sizes.shape(name) if name else None
    if shape is None or not all(isinstance(d, int) for d in shape):
        return 0
    # (element_count: np.prod's value without its per-call cost, asked for every node's outputs)
    return element_count(shape)


def _nbytes(sizes, name: str) -> int:
    return (sizes.nbytes(name) or 0) if name else 0


def flop_seconds(node: gs.Node, sizes) -> float:
    """The roofline estimate of one node (see the module docstring), in seconds."""
    outs = [t.name for t in node.outputs if t.name]
    ins = [t.name for t in node.inputs if t.name]
    out_elems = sum(_numel(sizes, t) for t in outs)
    moved = sum(_nbytes(sizes, t) for t in ins + outs)
    if node.op in MATMULS and node.inputs:
        a = sizes.shape(node.inputs[0].name) if node.inputs[0].name else None
        k = a[-1] if a and isinstance(a[-1], int) else 1
        if node.op == "Gemm" and node.attrs.get("transA") and a and len(a) == 2 and isinstance(a[0], int):
            k = a[0]
        flops = 2.0 * _numel(sizes, outs[0]) * k if outs else 0.0
    elif node.op == "ConvGrad" and len(node.inputs) > 2 and node.inputs[2].name:
        # (dY, X, W) -> dX, dW: two convolutions' worth of multiply-adds
        w = sizes.shape(node.inputs[2].name)
        per_out = element_count(w[1:]) if w and all(isinstance(d, int) for d in w) else 1
        flops = 4.0 * _numel(sizes, node.inputs[0].name) * per_out
    elif node.op in CONVS and len(node.inputs) > 1 and node.inputs[1].name:
        w = sizes.shape(node.inputs[1].name)
        per_out = element_count(w[1:]) if w and all(isinstance(d, int) for d in w) else 1
        flops = 2.0 * (_numel(sizes, outs[0]) if outs else 0) * per_out
    else:
        flops = float(out_elems * _OPS_PER_ELEMENT.get(node.op, 1))
    return max(flops / FLOPS, moved / BANDWIDTH, 1e-7)


def _replay_costs(nodes: list[gs.Node], seconds: dict[str, float], sizes) -> dict[str, float]:
    """Per replayable Dropout: the cost of the ``DropoutGrad`` reading its mask (the same kernel a
    replay runs), else the element-wise estimate of one."""
    from onnx_remat.remat.random_ops import is_replayable

    out: dict[str, float] = {}
    for n in nodes:
        if not n.name or not is_replayable(n):
            continue
        grads = [c for c in n.outputs[1].outputs if c.op == "DropoutGrad" and c.name in seconds]
        if grads and seconds[grads[0].name] > 0:
            out[n.name] = seconds[grads[0].name]
        else:
            out[n.name] = max(_numel(sizes, n.outputs[0].name) * 3 / FLOPS, 1e-7)
    return out


def estimate_costs(nodes: Iterable[gs.Node], sizes) -> NodeCosts:
    """The FLOP estimate for ``nodes``."""
    nodes = list(nodes)
    seconds = {n.name: flop_seconds(n, sizes) for n in nodes if n.name}
    replay = _replay_costs(nodes, seconds, sizes)
    return NodeCosts(seconds, "flops", "FLOP/byte roofline estimate (no profile)", replay=replay)


def exported_name(name: str) -> str:
    """The training graph's node name inside a name onnxruntime's optimizer made from it."""
    stripped = _FUSION_SUFFIX.sub("", _TOKEN_SUFFIX.sub("", name))
    return stripped or name


def kernel_times(events: list, skip_runs: int = 1) -> tuple[dict[str, float], int]:
    """Mean seconds per run of each kernel in an onnxruntime profile, and the runs averaged.

    The first ``skip_runs`` runs (``model_run`` events) are left out: the first run allocates and
    warms caches. With fewer runs than that, every run counts.
    """
    runs = sorted(
        (e["ts"], e["ts"] + e.get("dur", 0))
        for e in events
        if isinstance(e, dict) and e.get("cat") == "Session" and e.get("name") == "model_run" and "ts" in e
    )
    kept = runs[skip_runs:] if len(runs) > skip_runs else runs
    starts = [r[0] for r in kept]
    total: dict[str, float] = {}
    for e in events:
        if not (isinstance(e, dict) and e.get("cat") == "Node" and str(e.get("name", "")).endswith(_KERNEL_SUFFIX)):
            continue
        ts = e.get("ts", 0)
        if kept and not any(s <= ts <= end for s, end in kept):
            continue
        name = e["name"][: -len(_KERNEL_SUFFIX)]
        total[name] = total.get(name, 0.0) + e.get("dur", 0) * 1e-6
    n = max(len(starts), 1)
    return {k: v / n for k, v in total.items()}, n


def costs_from_kernel_times(
    kernels: dict[str, float], nodes: list[gs.Node], sizes, detail: str = "onnxruntime profile"
) -> NodeCosts:
    """Per-node costs from measured kernel times (see the module docstring for the mapping)."""
    by_name = {n.name: n for n in nodes if n.name}
    measured: dict[str, float] = {}
    for kernel, sec in kernels.items():
        name = kernel if kernel in by_name else exported_name(kernel)
        if name in by_name:
            measured[name] = measured.get(name, 0.0) + sec
    # A node the profile does not name was fused into another kernel or folded away by
    # onnxruntime's optimizer: its time is in the kernel that absorbed it, and its clone is
    # absorbed the same way, so it costs nothing of its own.
    seconds = {name: measured.get(name, 0.0) for name in by_name}
    unmatched = [name for name in by_name if name not in measured]
    return NodeCosts(seconds, "profile", detail, unmatched, _replay_costs(nodes, seconds, sizes))


def model_fingerprint(model_bytes: bytes) -> str:
    """What a cached profile is keyed by: the training graph's bytes."""
    return hashlib.sha256(model_bytes).hexdigest()[:16]


def cache_path(model_path: str | os.PathLike) -> Path:
    """Where the profile of a training graph file is cached: ``<graph>.remat-profile.json`` beside it."""
    p = Path(model_path)
    return p.with_name(p.name + PROFILE_SUFFIX)


def read_profile(path: str | os.PathLike) -> dict:
    """A cost profile file: this package's cache format (``{"kernels": {...}}``) or an onnxruntime
    profile (a JSON list of trace events). Returns ``{"kernels", "runs", "detail", ...}``."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise RematError(f"{path}: cannot read the profile ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RematError(f"{path}: not a profile (not JSON)") from None
    if isinstance(data, dict) and isinstance(data.get("kernels"), dict):
        return data
    if isinstance(data, list):
        kernels, runs = kernel_times(data)
        if kernels:
            return {"kernels": kernels, "runs": runs, "detail": f"onnxruntime profile {Path(path).name}"}
    raise RematError(f"{path}: neither an onnx-remat cost profile nor an onnxruntime profile with kernel events")


def node_costs(analysis, profile: str | os.PathLike | dict | None = None) -> NodeCosts:
    """Per-node costs of the analysed training graph: from ``profile`` (a file as
    :func:`read_profile` takes, or its dict) when given, ``"flops"`` for the FLOP estimate, else
    the cached profile beside the model when there is one for this exact graph, else the FLOP
    estimate."""
    nodes = analysis.graph.order
    data: dict | None = None
    if profile == FLOPS_SOURCE:
        return estimate_costs(nodes, analysis.sizes)
    if isinstance(profile, dict):
        data = profile
    elif profile is not None:
        data = read_profile(profile)
    elif analysis.source is not None:
        cached = cache_path(analysis.source.path)
        if cached.is_file():
            try:
                found = read_profile(cached)
            except RematError:
                found = None
            if found is not None and found.get("fingerprint") == model_fingerprint(analysis.source.path.read_bytes()):
                data = found
    if data is None:
        return estimate_costs(nodes, analysis.sizes)
    detail = str(data.get("detail", "profile"))
    return costs_from_kernel_times(data["kernels"], nodes, analysis.sizes, detail)
