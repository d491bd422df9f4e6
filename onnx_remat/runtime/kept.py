"""What onnxruntime kept of a recompute rewrite, and when the kept clones ran.

onnxruntime optimizes a graph before running it: common-subexpression elimination can merge a
clone back into its original, fusions can swallow it, and its execution order can run it long
before the backward pass needs it. Both undo the saving without any error. This module checks,
from files one measured session writes (:mod:`.worker`):

* the optimized graph (``SessionOptions.optimized_model_filepath``): how many clone and barrier
  nodes (named as :mod:`onnx_remat.graph.tags` says) survived, against how many the input file has;
* the profile of the first step (``enable_profiling``): the real execution order. For each segment
  of the model's ``onnx_remat.plan`` metadata, whether its clones ran after the node producing its
  trigger tensor (so: in the backward pass, when the segment's gradients arrive), and whether they
  ran after the forward pass ended.

onnxruntime's fusions rename what they fuse: ``/blocks.0/MatMul/remat`` fused with the ``Div``
before it becomes ``/blocks.0/MatMul/remat/MatMulScaleFusion/``. Such a node still counts as its
clone (kept, and ran); a clone absorbed into another node's fusion (the ``Div``) does not.

The forward pass ends with the last forward node that feeds another node: the loss node itself
is no marker, as onnxruntime runs it last (nothing but the graph output reads it). Forward nodes
are those not named as gradient nodes (``*_Grad/*``, ``AccumulateGrad_*``,
``GradientAccumulator*``), clones or barriers.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import onnx

from onnx_remat.errors import RematError
from onnx_remat.graph import tags
from onnx_remat.graph.conventions import is_gradient_node_name

_KERNEL_SUFFIX = "_kernel_time"
_CLONE_INFIX = tags.CLONE_SUFFIX + "/"


def clone_of(name: str) -> str | None:
    """The clone a node name stands for: itself, or the clone a fusion was named after; else None."""
    if tags.is_clone_name(name):
        return name
    if _CLONE_INFIX in name:
        return name.split(_CLONE_INFIX, 1)[0] + tags.CLONE_SUFFIX
    return None


def _is_forward_name(name: str) -> bool:

    return not (is_gradient_node_name(name) or clone_of(name) or tags.is_barrier_name(name))


def backward_node_names(model: onnx.ModelProto) -> set[str] | None:
    """Names of the nodes downstream of the loss gradient seed: the backward pass proper.

    The first of them to run is where the backward pass begins. A name-based guess at the end of
    the forward pass is not enough: onnxruntime creates nodes of its own (``Transpose_token_15``
    from pushing transposes through gradient sums) and can leave a forward node (a transpose whose
    partner it cancelled) to run late for a backward reader. None without a seed.
    """
    from collections import deque

    from onnx_remat.analysis.regions import analyze
    from onnx_remat.errors import RematError
    from onnx_remat.graph.bridge import ModelGraph

    try:
        tg = analyze(ModelGraph(model))
    except RematError:
        return None
    if tg.seed is None:
        return None
    seen: dict[int, str] = {}
    queue = deque(tg.seed.outputs)
    while queue:
        node = queue.popleft()
        if id(node) in seen:
            continue
        seen[id(node)] = node.name
        queue.extend(c for out in node.outputs for c in out.outputs)
    return {name for name in seen.values() if name}


@dataclass
class SegmentRun:
    """One plan segment in the run: clones kept and executed, and whether they ran late enough.

    Positions are indices in the execution order of the profiled step. ``ran_after_trigger`` and
    ``ran_after_forward`` are None when no clone ran or the reference node was not found.
    """

    label: str
    barrier: str | None
    clones: int
    clones_kept: int
    clones_ran: int
    barrier_kept: bool | None
    triggers: list[str]
    trigger_nodes: list[str]
    first_clone_position: int | None
    trigger_position: int | None
    ran_after_trigger: bool | None
    ran_after_forward: bool | None

    def to_json(self) -> dict:
        """JSON form (the dataclass fields)."""
        return asdict(self)


@dataclass
class RewriteCheck:
    """Clone and barrier counts in the input file and in onnxruntime's optimized graph, per segment runs."""

    clones_in_model: int
    clones_kept: int | None
    barriers_in_model: int
    barriers_kept: int | None
    clones_ran: int | None
    executed_nodes: int | None
    forward_end_node: str | None
    forward_end_position: int | None
    segments: list[SegmentRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def all_late(self) -> bool | None:
        """True when every segment's clones ran after their trigger; None if unknown or no segments."""
        known = [s.ran_after_trigger for s in self.segments if s.ran_after_trigger is not None]
        if not known:
            return None
        return all(known)

    def to_json(self) -> dict:
        """JSON form: the counts, ``forward_end_*``, ``segments`` and ``notes``."""
        data = asdict(self)
        data["segments"] = [s.to_json() for s in self.segments]
        return data


def read_plan(model: onnx.ModelProto) -> list[dict]:
    """The ``onnx_remat.plan`` metadata of a rewritten model (empty list if absent or unreadable)."""
    for prop in model.metadata_props:
        if prop.key == tags.PLAN_KEY:
            try:
                plan = json.loads(prop.value)
            except json.JSONDecodeError:
                return []
            return plan if isinstance(plan, list) else []
    return []


def execution_order(profile_path: str | os.PathLike) -> list[str]:
    """Node names in the order their kernels ran in an onnxruntime profile (first run profiled)."""
    return _kernel_order(json.loads(Path(profile_path).read_text()))


def _kernel_order(events: list) -> list[str]:
    kernels = [
        e
        for e in events
        if isinstance(e, dict) and e.get("cat") == "Node" and str(e.get("name", "")).endswith(_KERNEL_SUFFIX)
    ]
    kernels.sort(key=lambda e: e.get("ts", 0))
    return [e["name"][: -len(_KERNEL_SUFFIX)] for e in kernels]


def read_execution_order(path: str | os.PathLike) -> list[str]:
    """Node names in execution order from ``path``: a JSON list of names, or an onnxruntime profile
    (``enable_profiling``), whose ``*_kernel_time`` events are taken in time order. Raises a
    one-line :class:`RematError` for anything else."""
    if not Path(path).is_file():
        raise RematError(f"{path}: " + ("not a regular file" if Path(path).exists() else "no such file"))
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise RematError(f"{path}: cannot read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise RematError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    except UnicodeDecodeError:
        raise RematError(f"{path}: not JSON (not UTF-8 text)") from None
    if isinstance(data, list) and all(isinstance(x, str) for x in data):
        return data
    order = _kernel_order(data) if isinstance(data, list) else []
    if order:
        return order
    raise RematError(f"{path}: neither a JSON list of node names nor an onnxruntime profile")


def check_order_matched(est, path: str | os.PathLike, given: int) -> None:
    """Raise a one-line :class:`RematError` when none of the ``given`` node names read from
    ``path`` (:func:`read_execution_order`) named a node of the estimated graph ``est`` (a
    :class:`~onnx_remat.estimate.MemoryEstimate`): a profile of another model would otherwise be
    ignored silently and the emulated order used."""
    if given and not getattr(est, "matched_order_nodes", None):
        raise RematError(
            f"{path}: none of its {given} node names is a node of this model (a profile of another model?); "
            "give the profile onnxruntime wrote for this one"
        )


def _producers(graph: onnx.GraphProto) -> dict[str, str]:
    out = {}
    for node in graph.node:
        for o in node.output:
            if o:
                out[o] = node.name
    return out


def _feeding_nodes(graph: onnx.GraphProto) -> set[str]:
    """Names of nodes with an output that another node reads."""
    read = {i for node in graph.node for i in node.input if i}
    return {node.name for node in graph.node if any(o in read for o in node.output if o)}


def check_rewrite(
    model: onnx.ModelProto,
    optimized_path: str | os.PathLike | None,
    profile_path: str | os.PathLike | None,
) -> RewriteCheck:
    """Compare ``model`` (the file given to onnxruntime) with what onnxruntime made and ran of it."""
    names_in = [n.name for n in model.graph.node]
    check = RewriteCheck(
        clones_in_model=sum(tags.is_clone_name(n) for n in names_in),
        clones_kept=None,
        barriers_in_model=sum(tags.is_barrier_name(n) for n in names_in),
        barriers_kept=None,
        clones_ran=None,
        executed_nodes=None,
        forward_end_node=None,
        forward_end_position=None,
    )
    optimized = None
    if optimized_path and Path(optimized_path).is_file():
        try:
            optimized = onnx.load(str(optimized_path), load_external_data=False)
        except Exception as exc:
            check.notes.append(f"optimized graph unreadable: {exc}")
    else:
        check.notes.append("onnxruntime wrote no optimized graph")
    kept_names: set[str] = set()
    kept_clones: set[str] = set()
    if optimized is not None:
        kept_names = {n.name for n in optimized.graph.node}
        kept_clones = {c for c in map(clone_of, kept_names) if c}
        check.clones_kept = len(kept_clones)
        check.barriers_kept = sum(tags.is_barrier_name(n) for n in kept_names)

    order: list[str] = []
    if profile_path and Path(profile_path).is_file():
        try:
            order = execution_order(profile_path)
        except (OSError, json.JSONDecodeError, KeyError) as exc:
            check.notes.append(f"profile unreadable: {exc}")
    else:
        check.notes.append("no profile")
    position: dict[str, int] = {}
    clone_position: dict[str, int] = {}
    for i, name in enumerate(order):
        position.setdefault(name, i)
        c = clone_of(name)
        if c:
            clone_position.setdefault(c, i)
    if order:
        check.executed_nodes = len(order)
        check.clones_ran = len(clone_position)
        backward_names = backward_node_names(model)
        start = next((i for i, n in enumerate(order) if n in backward_names), None) if backward_names else None
        if start:
            # The forward pass ends where the backward pass begins.
            check.forward_end_position, check.forward_end_node = start - 1, order[start - 1]
        else:
            feeding = _feeding_nodes((optimized or model).graph)
            forward = [(i, n) for i, n in enumerate(order) if _is_forward_name(n) and n in feeding]
            if forward:
                check.forward_end_position, check.forward_end_node = forward[-1]

    producers_opt = _producers(optimized.graph) if optimized is not None else {}
    producers_in = _producers(model.graph)

    inputs_in = {node.name: [i for i in node.input if i] for node in model.graph.node}

    def producer_position(tensor: str, depth: int = 0) -> tuple[str | None, int | None]:
        for table in (producers_opt, producers_in):
            node = table.get(tensor)
            if node is not None and node in position:
                return node, position[node]
        node = producers_opt.get(tensor) or producers_in.get(tensor)
        # onnxruntime removed the producer (an Identity, say): the tensor exists once the
        # producers of that node's inputs have run.
        if node is None or node not in inputs_in or depth >= 8:
            return node, None
        known = [(n, p) for n, p in (producer_position(i, depth + 1) for i in inputs_in[node]) if p is not None]
        if not known:
            return node, None
        return max(known, key=lambda f: f[1])

    for entry in read_plan(model):
        clones = [c for c in entry.get("clones", []) if isinstance(c, str)]
        triggers = [t for t in entry.get("triggers", []) if isinstance(t, str)]
        barrier = entry.get("barrier")
        ran = [clone_position[c] for c in clones if c in clone_position]
        trig = [producer_position(t) for t in triggers]
        trig_nodes = [n for n, _ in trig if n]
        trig_pos = [p for _, p in trig if p is not None]
        first = min(ran) if ran else None
        trigger_position = max(trig_pos) if trig_pos and len(trig_pos) == len(triggers) else None
        seg = SegmentRun(
            label=str(entry.get("label", "?")),
            barrier=barrier,
            clones=len(clones),
            clones_kept=sum(c in kept_clones for c in clones) if optimized is not None else 0,
            clones_ran=len(ran),
            barrier_kept=(barrier in kept_names) if (barrier and optimized is not None) else None,
            triggers=triggers,
            trigger_nodes=trig_nodes,
            first_clone_position=first,
            trigger_position=trigger_position,
            ran_after_trigger=(first > trigger_position)
            if (first is not None and trigger_position is not None)
            else None,
            ran_after_forward=(
                (first > check.forward_end_position)
                if (first is not None and check.forward_end_position is not None)
                else None
            ),
        )
        if optimized is None:
            seg.clones_kept = None  # type: ignore[assignment]
        check.segments.append(seg)
    return check
