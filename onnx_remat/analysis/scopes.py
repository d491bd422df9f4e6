"""Analysis pass: the module scope of every forward node, as a tree, and pattern matching on it.

Input: a :class:`~onnx_remat.analysis.regions.TrainingGraph` (and optionally the
``eval_model.onnx`` beside it). Output: a :class:`ScopeTree`.

A forward node's scope is the module path it was exported from, read from

1. node metadata written by the dynamo exporter (or by :func:`onnx_remat.exporters.annotate_scopes`):
   ``pkg.torch.onnx.name_scopes`` = "['', 'blocks.0', 'blocks.0.drop', 'native_dropout']" and
   ``pkg.torch.onnx.class_hierarchy`` = "['m.Net', 'm.Block', 'torch...Dropout', 'aten...']";
2. the same metadata on the node of the same name in ``eval_model.onnx`` (generate_artifacts drops
   node metadata from the training graph but keeps node names);
3. TorchScript exporter names: ``/blocks.0/attn/MatMul`` is in ``blocks.0.attn``.

Gradient nodes never belong to a scope. A path component may itself contain dots
(``blocks.0`` is one component), so the tree is built from the exporter's components, not by
splitting paths on dots.

Patterns (:meth:`ScopeTree.match`): a module path (``blocks.0.attn``), a glob on paths where
``*`` matches within one dot-separated segment and ``**`` any number of segments
(``blocks.*``, ``encoder.layer.*.attention``), or a class name (``Block``, ``*Attention``)
where the class hierarchy is known. Matches nested in another match are folded into the outer
one and reported.
"""

from __future__ import annotations

import ast
import difflib
import fnmatch
import functools
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

import onnx
import onnx_graphsurgeon as gs

from onnx_remat.analysis.calls import Parameters, call_of_nodes
from onnx_remat.analysis.regions import TrainingGraph
from onnx_remat.errors import RematError

NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
CLASS_HIERARCHY_KEY = "pkg.torch.onnx.class_hierarchy"


@dataclass(eq=False)
class Scope:
    """One module instance: its path, class (if known), child scopes and forward nodes."""

    path: str
    parent: Scope | None = None
    class_name: str | None = None
    children: list[Scope] = field(default_factory=list)
    nodes: list[gs.Node] = field(default_factory=list)  # forward nodes directly in this scope

    @property
    def module_path(self) -> str:
        """The module instance's path: :attr:`path` without the marks of its calls where the
        instance ran more than once (``layers.0@2.attn`` -> ``layers.0.attn``: :func:`_split_calls`)."""
        return _CALL_MARK.sub("", self.path)

    @property
    def short_class(self) -> str | None:
        """The class name without its module (``Block`` for ``models.blocks10.Block``)."""
        return self.class_name.rsplit(".", 1)[-1] if self.class_name else None

    def walk(self) -> Iterator[Scope]:
        """This scope and all scopes below it, parents before children (iterative)."""
        stack = [self]
        while stack:
            scope = stack.pop()
            yield scope
            stack.extend(reversed(scope.children))

    def all_nodes(self) -> list[gs.Node]:
        """Forward nodes in this scope and every scope below it."""
        return [n for s in self.walk() for n in s.nodes]

    def ancestors(self) -> Iterator[Scope]:
        scope = self.parent
        while scope is not None:
            yield scope
            scope = scope.parent

    def __repr__(self) -> str:
        return f"Scope({self.path!r}, class={self.short_class}, nodes={len(self.nodes)})"


@dataclass
class ScopeMatch:
    """Result of matching patterns: the outermost matched scopes and the nested ones folded in."""

    scopes: list[Scope]
    nested: list[tuple[Scope, Scope]]  # (inner match, the outer match that contains it)
    by_pattern: dict[str, list[Scope]]


class ScopeTree:
    """The scope tree of a training graph's forward nodes. Build with :func:`resolve_scopes`."""

    def __init__(self, root: Scope, scope_of: dict[int, Scope], source: str):
        self.root = root
        self._scope_of = scope_of
        self.source = source  # where scope information came from, for reports
        self.by_path: dict[str, Scope] = {s.path: s for s in root.walk()}
        self.has_classes = any(s.class_name for s in root.walk() if s is not root)

    def scope_of(self, node: gs.Node) -> Scope | None:
        """The innermost scope of a forward node (None for gradient nodes)."""
        return self._scope_of.get(id(node))

    def scopes(self) -> list[Scope]:
        """All scopes except the root, parents before children."""
        return [s for s in self.root.walk() if s is not self.root]

    def match(self, patterns: list[str]) -> ScopeMatch:
        """Scopes matching any of ``patterns``; outer matches absorb nested ones.

        Raises :class:`RematError` naming the closest scopes when a pattern matches nothing.
        """
        matched: dict[int, Scope] = {}
        by_pattern: dict[str, list[Scope]] = {}
        scopes = self.scopes()
        literal: dict[str, list[int]] | None = None  # name -> positions in ``scopes``, built once
        for pattern in patterns:
            if any(c in pattern for c in "*?["):
                hits = [s for s in scopes if _matches(pattern, s)]
            else:
                # A pattern without wildcards matches a path, a short or a full class name exactly:
                # looked up, not compared with every scope (a budget asks for every layer by path).
                if literal is None:
                    literal = _literal_index(scopes)
                hits = [scopes[k] for k in literal.get(pattern, [])]
            if not hits:
                raise RematError(self._no_match_message(pattern))
            by_pattern[pattern] = hits
            for s in hits:
                matched[id(s)] = s
        outer: list[Scope] = []
        nested: list[tuple[Scope, Scope]] = []
        for scope in self.root.walk():
            if id(scope) not in matched:
                continue
            container = next((a for a in scope.ancestors() if id(a) in matched), None)
            if container is None:
                outer.append(scope)
            else:
                nested.append((scope, _outermost_matched(scope, matched)))
        return ScopeMatch(scopes=outer, nested=nested, by_pattern=by_pattern)

    def _no_match_message(self, pattern: str) -> str:
        names = [s.path for s in self.scopes()]
        names += sorted({s.short_class for s in self.scopes() if s.short_class})
        close = difflib.get_close_matches(pattern, names, n=3, cutoff=0.4)
        if not close:
            top = [s.path for s in self.root.children][:3]
            close = top
        hint = f"; closest: {', '.join(close)}" if close else "; the graph has no scope information"
        if not self.has_classes and re.fullmatch(r"[A-Z]\w*", pattern):
            hint += " (class names are unknown for this graph: match module paths instead)"
        return f"scope pattern {pattern!r} matches no scope{hint}"

    def repeated_layers(self) -> list[list[Scope]]:
        """Groups of sibling scopes that are the same layer repeated (same class or structure).

        Siblings form a group when they share a class name, or (without class information) the
        same sequence of op types. Only groups of two or more are returned.
        """
        groups: list[list[Scope]] = []
        for parent in self.root.walk():
            by_key: dict[tuple, list[Scope]] = defaultdict(list)
            for child in parent.children:
                if child.class_name:
                    key: tuple = ("class", child.class_name)
                else:
                    key = ("ops", tuple(n.op for n in child.all_nodes()))
                by_key[key].append(child)
            groups.extend(g for g in by_key.values() if len(g) > 1)
        return groups


def _outermost_matched(scope: Scope, matched: dict[int, Scope]) -> Scope:
    outer = scope
    for a in scope.ancestors():
        if id(a) in matched:
            outer = a
    return outer


def _segment_regex(segment: str) -> str:
    """Regex for one dot-separated pattern segment: ``*``/``?`` never cross a dot; ``**`` spans segments."""
    if segment == "**":
        return r"[^.]+(?:\.[^.]+)*"
    out, i = [], 0
    while i < len(segment):
        ch = segment[i]
        if ch == "*":
            out.append("[^.]*")
        elif ch == "?":
            out.append("[^.]")
        elif ch == "[" and "]" in segment[i + 1 :]:
            end = segment.index("]", i + 1)
            body = segment[i + 1 : end]
            out.append("[^" + re.escape(body[1:]) + "]" if body.startswith("!") else "[" + re.escape(body) + "]")
            i = end
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)


def _literal_index(scopes: list[Scope]) -> dict[str, list[int]]:
    """Positions of the scopes each literal pattern matches (:func:`_matches` without wildcards:
    the path, the module path, the short class name or the full class name equal to it), ascending."""
    index: dict[str, list[int]] = {}
    for k, scope in enumerate(scopes):
        names = {scope.path, scope.module_path}
        if scope.class_name:
            names.update((scope.short_class or scope.class_name, scope.class_name))
        for name in names:
            index.setdefault(name, []).append(k)
    return index


@functools.lru_cache(maxsize=256)
def _path_regex(pattern: str) -> re.Pattern[str]:
    return re.compile(r"\.".join(_segment_regex(seg) for seg in pattern.split(".")) + r"\Z")


def _matches(pattern: str, scope: Scope) -> bool:
    regex = _path_regex(pattern)
    if regex.match(scope.path) or (scope.module_path != scope.path and regex.match(scope.module_path)):
        return True
    if scope.class_name:
        short = scope.short_class or scope.class_name
        return fnmatch.fnmatchcase(short, pattern) or fnmatch.fnmatchcase(scope.class_name, pattern)
    return False


def _metadata_chain(metadata: dict[str, str]) -> list[tuple[str, str | None]] | None:
    """[(module path, class name)] from dynamo-style node metadata, outermost first, root excluded."""
    raw = metadata.get(NAME_SCOPES_KEY)
    if not raw:
        return None
    try:
        names = ast.literal_eval(raw)
        classes = ast.literal_eval(metadata[CLASS_HIERARCHY_KEY]) if CLASS_HIERARCHY_KEY in metadata else []
    except (ValueError, SyntaxError):
        return None
    if not isinstance(names, list) or len(names) < 2:
        return None
    # names: ['', 'blocks.0', 'blocks.0.drop', '<op>']: the last entry is the node's own op.
    chain = []
    for i, path in enumerate(names[1:-1], start=1):
        cls = classes[i] if i < len(classes) else None
        chain.append((str(path), str(cls) if cls else None))
    return chain


# onnxruntime names the nodes its optimizer makes after a node they replace: ``<name>/LayerNormFusion/``,
# ``<name>/MatMulScaleFusion/``, and ``<base>_token_<k>`` when a name is taken.
_RUNTIME_SUFFIX = re.compile(r"(?:_token_\d+)?$")
_FUSION_SUFFIX = re.compile(r"(?:/[A-Za-z0-9]+Fusion/)+$")


def _exported_name(name: str) -> str:
    """The exporter's node name inside a name onnxruntime's optimizer made from it."""
    stripped = _FUSION_SUFFIX.sub("", _RUNTIME_SUFFIX.sub("", name))
    return stripped or name


def _name_chain(name: str) -> list[tuple[str, str | None]]:
    """[(module path, None)] from a TorchScript node name such as ``/blocks.0/attn/MatMul``.

    A component is the module's name relative to its parent (``attn``) or, for children of
    containers, its full path (``/layers.0/layers.0.0/conv1/Conv``): both give ``layers.0.0.conv1``.
    Nodes onnxruntime fused keep the name they were made from, with a suffix that is dropped
    (``/h.0/ln_1/Mul/LayerNormFusion/`` is in ``h.0.ln_1``).
    """
    name = _exported_name(name)
    if not name.startswith("/"):
        return []
    parts = [p for p in name.split("/")[1:-1] if p]
    chain: list[tuple[str, str | None]] = []
    path = ""
    for part in parts:
        if not path or part.startswith(path + "."):
            path = part
        else:
            path = f"{path}.{part}"
        chain.append((path, None))
    return chain


def natural_key(path: str) -> list:
    """Sort key that puts blocks.2 before blocks.10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path)]


def resolve_scopes(tg: TrainingGraph, eval_model: onnx.ModelProto | None = None) -> ScopeTree:
    """Build the scope tree of ``tg``'s forward nodes.

    ``eval_model`` (the artifacts' ``eval_model.onnx``) supplies node metadata by node name when
    the training graph lost it. Where metadata is missing, TorchScript node names are used.
    """
    # onnxruntime renames some forward nodes in the training graph (Gelu -> com.microsoft Gelu,
    # BatchNormalization -> ..._BatchNormInternal) but keeps their output tensor names, so the
    # eval model's metadata is looked up by node name, then by output name.
    eval_meta: dict[str, dict[str, str]] = {}
    eval_meta_by_output: dict[str, dict[str, str]] = {}
    if eval_model is not None:
        for proto in eval_model.graph.node:
            if not proto.metadata_props:
                continue
            props = {p.key: p.value for p in proto.metadata_props}
            if proto.name:
                eval_meta[proto.name] = props
            for out in proto.output:
                if out:
                    eval_meta_by_output[out] = props

    root = Scope(path="")
    root_class = None
    by_path: dict[str, Scope] = {"": root}
    scope_of: dict[int, Scope] = {}
    sources: set[str] = set()
    unplaced: set[int] = set()  # nodes no source gave a scope (see _place_unscoped_nodes)

    for node in tg.forward_nodes:
        chain = _metadata_chain(tg.mg.extras(node).metadata)
        if chain is not None:
            sources.add("node metadata")
        else:
            meta: dict[str, str] | None = eval_meta.get(node.name) or next(
                (eval_meta_by_output[o.name] for o in node.outputs if o.name in eval_meta_by_output), None
            )
            if meta is not None:
                chain = _metadata_chain(meta)
                if chain is not None:
                    sources.add("eval_model.onnx metadata")
        if chain is None:
            chain = _name_chain(node.name)
            if chain:
                sources.add("node names")
            elif not node.name.startswith("/"):
                unplaced.add(id(node))  # a TorchScript name without a module ("/Reshape") is the root's
        if root_class is None:
            root_class = _root_class(tg.mg.extras(node).metadata) or _root_class(eval_meta.get(node.name, {}))
        scope = root
        for path, cls in chain:
            child = by_path.get(path)
            if child is None:
                child = Scope(path=path, parent=scope, class_name=cls)
                scope.children.append(child)
                by_path[path] = child
            elif child.class_name is None and cls:
                child.class_name = cls
            scope = child
        scope.nodes.append(node)
        scope_of[id(node)] = scope
    _place_unscoped_nodes(tg, root, scope_of, unplaced)
    parameters = Parameters.of(tg.parameters, tg.is_forward)
    if parameters.read_twice():  # (else no scope can have run more than once: most graphs)
        _split_calls(tg, parameters, root, scope_of)
        _numbered_calls(parameters, root, scope_of)
    root.class_name = root_class
    for scope in root.walk():
        scope.children.sort(key=lambda c: natural_key(c.path))
    source = " + ".join(sorted(sources)) if sources else "none"
    return ScopeTree(root, scope_of, source)


# The mark of a call in a path (``layers.0@2``): a module path never has one (a Python attribute
# name, a container index or a TorchScript scope name has no ``@``).
_CALL_MARK = re.compile(r"@\d+(?=\.|\Z)")


def _split_calls(tg: TrainingGraph, parameters: Parameters, root: Scope, scope_of: dict[int, Scope]) -> None:
    """Replace, in place, each scope the forward pass ran more than once by one scope per call
    (:mod:`onnx_remat.analysis.calls`), top down: ``layers.0`` run three times becomes siblings
    ``layers.0@1``, ``layers.0@2`` and ``layers.0@3`` (1 for the first call), each holding that
    call's nodes and its own copies of the scopes below (``layers.0@2.attn``), which may be split
    in turn. The calls are then what patterns select and what the budget planner's units are:
    siblings of one class, a repeated layer (``parameters``: the graph's, as calls read them)."""
    position = tg.position
    stack = list(root.children)  # (the root stands for the whole model: never split)
    while stack:
        scope = stack.pop()
        nodes = sorted(scope.all_nodes(), key=lambda n: position[id(n)])
        calls = call_of_nodes(nodes, parameters)
        if calls is None:
            stack.extend(scope.children)
            continue
        call_of = {id(n): c for n, c in zip(nodes, calls, strict=True)}
        parent = scope.parent
        assert parent is not None
        split = _one_scope_per_call(scope, call_of, max(calls) + 1, scope_of)
        at = parent.children.index(scope)
        parent.children[at : at + 1] = split
        stack.extend(split)  # a call may run a scope below it more than once in turn


def _one_scope_per_call(scope: Scope, call_of: dict[int, int], calls: int, scope_of: dict[int, Scope]) -> list[Scope]:
    """``scope`` as one copy per call (``call_of``: node id -> call), each holding the nodes of its
    call and copies of the scopes below that hold any (``scope_of`` is updated): paths marked with
    the call, 1-based (``layers.0@2``, ``layers.0@2.attn``). One pass over the nodes below."""
    old = scope.path
    tops = [Scope(path=f"{old}@{c + 1}", parent=scope.parent, class_name=scope.class_name) for c in range(calls)]
    copies: dict[tuple[int, int], Scope] = {(id(scope), c): top for c, top in enumerate(tops)}

    def copy_of(source: Scope, call: int) -> Scope:
        # made on its first node of that call, with the copies above it that are missing
        missing: list[Scope] = []
        at = source
        while (id(at), call) not in copies:
            missing.append(at)
            assert at.parent is not None
            at = at.parent
        above = copies[(id(at), call)]
        mark = f"{old}@{call + 1}"
        for s in reversed(missing):
            path = mark + s.path[len(old) :] if s.path.startswith(old + ".") else f"{s.path}@{call + 1}"
            above = Scope(path=path, parent=above, class_name=s.class_name)
            above.parent.children.append(above)  # type: ignore[union-attr]
            copies[(id(s), call)] = above
        return above

    for source in scope.walk():
        for n in source.nodes:
            home = copy_of(source, call_of[id(n)])
            home.nodes.append(n)
            scope_of[id(n)] = home
    return tops


# TorchScript's name for the k-th repeated call of a module (``cell_1`` for the second call of ``cell``).
_NUMBERED = re.compile(r"(?P<base>.+)_(?P<k>\d+)")


def _numbered_calls(parameters: Parameters, root: Scope, scope_of: dict[int, Scope]) -> None:
    """Make TorchScript's numbered scopes calls (in place). TorchScript names the ``k``-th repeated
    call of a module ``<name>_<k>``: a cell run per time step gives siblings ``cell``, ``cell_1``,
    ... where it holds each call's nodes, and a layer split into calls already
    (:func:`_split_calls`) keeps its later calls' own nodes in ``layer_1``, ... A numbered sibling
    is taken as call ``k + 1`` of its base where the base's calls are told apart that way: by the
    parameters they read (each reads some of the base's: the siblings become ``cell@1``,
    ``cell@2``, ..., with the base's class), or, where the base is split into calls already, by
    the data (its nodes read or feed that call's: they join ``layer@(k + 1)``). A module named
    ``conv_1`` beside a ``conv`` of its own reads other parameters and stays as it is."""
    for parent in list(root.walk()):
        by_path = {c.path: c for c in parent.children}
        numbered: dict[str, list[tuple[int, Scope]]] = {}
        for c in parent.children:
            m = _NUMBERED.fullmatch(c.path)
            if m is not None and (m["base"] in by_path or f"{m['base']}@1" in by_path):
                numbered.setdefault(m["base"], []).append((int(m["k"]), c))
        for base, later in numbered.items():
            later.sort(key=lambda kc: kc[0])
            if base in by_path:
                _rename_numbered(by_path[base], later, parameters)
            else:
                _join_numbered(by_path, base, later, scope_of)


def _read_parameters(scope: Scope, parameters: Parameters) -> set[int]:
    return {p for n in scope.all_nodes() for p in parameters.read_by(n)}


def _rename_numbered(base: Scope, later: list[tuple[int, Scope]], parameters: Parameters) -> None:
    """``base`` and its numbered siblings ``later`` as calls ``@1``, ``@k + 1``, where each reads
    some of ``base``'s parameters and the numbers run 1, 2, ... without a gap."""
    own = _read_parameters(base, parameters)
    if not own or [k for k, _ in later] != list(range(1, len(later) + 1)):
        return
    if any(own.isdisjoint(_read_parameters(c, parameters)) for _, c in later):
        return
    name = base.path
    for call, scope in enumerate([base, *(c for _, c in later)], start=1):
        old, new = scope.path, f"{name}@{call}"
        for s in scope.walk():
            s.path = new + s.path[len(old) :] if s.path.startswith(old) else s.path
        scope.class_name = scope.class_name or base.class_name


def _join_numbered(by_path: dict[str, Scope], base: str, later: list[tuple[int, Scope]], scope_of) -> None:
    """The nodes of each numbered sibling ``base_k`` moved into call ``base@(k + 1)`` where they read
    or feed that call's nodes (and the sibling, then empty, dropped)."""
    for k, scope in later:
        call = by_path.get(f"{base}@{k + 1}")
        if call is None or scope.children:
            continue
        theirs = {id(n) for n in call.all_nodes()}
        near = any(
            (t.inputs and id(t.inputs[0]) in theirs) or any(id(c) in theirs for c in t.outputs)
            for n in scope.nodes
            for t in [*n.inputs, *n.outputs]
        )
        if not near:
            continue
        call.nodes.extend(scope.nodes)
        for n in scope.nodes:
            scope_of[id(n)] = call
        assert scope.parent is not None
        scope.parent.children.remove(scope)


def _common_scope(scopes: list[Scope]) -> Scope | None:
    """The innermost scope containing all of ``scopes``."""
    chain = [scopes[0], *scopes[0].ancestors()]
    depth = {id(s): k for k, s in enumerate(chain)}
    best = 0
    for s in scopes[1:]:
        while id(s) not in depth:
            if s.parent is None:
                return None
            s = s.parent
        best = max(best, depth[id(s)])
    return chain[best]


def _place_unscoped_nodes(tg: TrainingGraph, root: Scope, scope_of: dict[int, Scope], unplaced: set[int]) -> None:
    """Nodes made without a trace of their scope go to the innermost scope holding all their scoped
    neighbours (the nodes they read from and feed), when there are two or more: a GELU onnxruntime
    fused between two Linear layers of an MLP belongs to that MLP, and so does a ``Split`` the
    dynamo exporter's optimizer made from an attention's slices (``node_Split_291``, no metadata),
    which would otherwise keep its outputs and its input's stored when the layer is recomputed."""
    for node in tg.forward_nodes:
        if id(node) not in unplaced or scope_of.get(id(node)) is not root:
            continue
        neighbours: dict[int, Scope] = {}
        for t in node.inputs:
            p = t.inputs[0] if t.inputs else None
            if p is not None and tg.is_forward(p):
                neighbours[id(p)] = scope_of.get(id(p), root)
        for t in node.outputs:
            for c in t.outputs:
                if tg.is_forward(c):
                    neighbours[id(c)] = scope_of.get(id(c), root)
        scoped = [s for s in neighbours.values() if s is not root]
        if len(scoped) < 2:
            continue
        home = _common_scope(scoped)
        if home is not None and home is not root:
            root.nodes.remove(node)
            home.nodes.append(node)
            scope_of[id(node)] = home


def _root_class(metadata: dict[str, str]) -> str | None:
    raw = metadata.get(CLASS_HIERARCHY_KEY)
    if not raw:
        return None
    try:
        classes = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return None
    return str(classes[0]) if isinstance(classes, list) and classes else None
