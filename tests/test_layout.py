"""The package's layout rules, read from the source with ``ast`` (nothing is imported):

* no import cycle among onnx-remat's own modules (``onnx_remat/`` and ``cli/``, installed as
  ``onnx_remat.cli``): no strongly connected component of more than one module, counting every
  import, at module level or inside a function, and a package ``__init__`` as the module it is (a
  module importing ``onnx_remat.x`` whose ``__init__`` imports that module back is a cycle);
* no private name (one leading underscore) imported from another module: what two modules share
  is public there, with a docstring.

Imports under ``if TYPE_CHECKING:`` (annotations only) and under ``if __name__ == "__main__":``
(a script's entry, run after the module is loaded) do not count.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# package name -> its folder in the repository (pyproject's package-dir)
PACKAGES = {"onnx_remat": ROOT / "onnx_remat", "onnx_remat.cli": ROOT / "cli"}


def module_files(packages: dict[str, Path]) -> dict[str, Path]:
    """Every module of ``packages`` by its dotted name (a package by its ``__init__``'s name)."""
    out: dict[str, Path] = {}
    for package, folder in packages.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _is_main_guard(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    has_name = any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
    has_main = any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)
    return has_name and has_main


def import_statements(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree``, at any depth, but those under ``if TYPE_CHECKING:`` or
    ``if __name__ == "__main__":`` (their ``else`` branches are kept)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if isinstance(node, ast.If) and (_is_type_checking(node.test) or _is_main_guard(node.test)):
            stack.extend(reversed(node.orelse))
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _base_of(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module name a ``from ... import`` reads from (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    anchor = parts if is_package else parts[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join([*anchor, node.module] if node.module else anchor)


def scan(packages: dict[str, Path]) -> tuple[dict[str, set[str]], list[str]]:
    """The import graph of the modules of ``packages`` (module -> the own modules it imports) and
    the private imports across modules (``"importer: from module import _name"``)."""
    files = module_files(packages)
    graph: dict[str, set[str]] = {name: set() for name in files}
    private: list[str] = []
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in import_statements(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
                base = None
            else:
                base = _base_of(node, name, is_package)
                targets = []
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in files else base)
                    if (
                        base in files
                        and base != name
                        and alias.name.startswith("_")
                        and not alias.name.startswith("__")
                    ):
                        private.append(f"{name}: from {base} import {alias.name}")
            for target in targets:
                if target in files and target != name:
                    graph[name].add(target)
    return graph, private


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        # iterative depth-first search: (node, its successors still to visit)
        work: list[tuple[str, Iterator[str]]] = []
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work.append((root, iter(sorted(graph[root]))))
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _describe(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    edges = [f"{a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return f"{', '.join(component)} ({'; '.join(edges)})"


def test_no_import_cycles():
    graph, _ = scan(PACKAGES)
    found = cycles(graph)
    assert not found, "import cycles among onnx-remat's modules:\n" + "\n".join(_describe(c, graph) for c in found)


def test_no_private_names_across_modules():
    _, private = scan(PACKAGES)
    assert not private, (
        "private names imported from another module (make them public there, with a docstring):\n" + "\n".join(private)
    )


def test_the_scan_sees_the_imports():
    """The scan reads real edges: module level, inside functions, from a package, from the cli."""
    graph, _ = scan(PACKAGES)
    assert "onnx_remat.runtime.measure" in graph["onnx_remat.runtime.compare"]  # module level
    assert "onnx_remat.runtime.measure" in graph["onnx_remat.runtime.profile"]  # `from ..runtime import measure`
    assert "onnx_remat.runtime.cuda" in graph["onnx_remat.runtime.measure"]  # inside a function only
    assert "onnx_remat.cli.main" in graph["onnx_remat.cli.entry"]
    # excluded by rule: cli/main.py's `if __name__ == "__main__":` imports the entry point
    assert "onnx_remat.cli.entry" not in graph["onnx_remat.cli.main"]


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_rules_catch_cycles_and_private_imports(tmp_path):
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import thing\n",
            "pkg/a.py": "def f():\n    from pkg import b\n",  # inside a function
            "pkg/b.py": "from . import a\nfrom pkg.c import _secret, __version__\n",  # relative
            "pkg/c.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from pkg.d import D\n"
                "if __name__ == '__main__':\n    import pkg.d\n"
            ),
            "pkg/d.py": "import pkg.c\nfrom pkg import thing\n",  # the package __init__ imports a, not d
            "pkg/sub/__init__.py": "from .e import E\n",
            "pkg/sub/e.py": "from pkg.sub import E\n",  # a package __init__ that imports it back
        },
    )
    graph, private = scan({"pkg": tmp_path / "pkg"})
    assert graph["pkg.c"] == set()
    assert graph["pkg.d"] == {"pkg", "pkg.c"}
    assert cycles(graph) == [["pkg.a", "pkg.b"], ["pkg.sub", "pkg.sub.e"]]
    assert private == ["pkg.b: from pkg.c import _secret"]
