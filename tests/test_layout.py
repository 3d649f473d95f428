"""The package's plan holds: no module imports one that imports it back (directly or round a longer circle, lazy
imports inside functions included), and the folders and top-level modules are exactly those docs/design.md's plan
describes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "transduce"
DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """The nodes under ``if TYPE_CHECKING:`` (imports for type checkers only, never run)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for statement in node.body for n in ast.walk(statement)}
    return skip


def import_graph() -> dict[str, set[str]]:
    """Module -> the transduce modules it imports anywhere in its text (a name imported from a package counts as the
    submodule of that name where there is one, else as the package)."""
    modules = _modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]  # fmt: skip
            else:
                continue
            for target in targets:
                found = owner(target)
                if found and found != module and found.startswith("transduce"):
                    graph[module].add(found)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return found


def test_the_circle_finder_finds_a_circle_and_a_longer_one():
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": set(), "d": {"e"}, "e": {"f"}, "f": {"d", "c"}}
    assert sorted(circles(graph)) == [["a", "b"], ["d", "e", "f"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_module_imports_one_that_imports_it_back():
    graph = import_graph()
    assert graph["transduce.serving.server"] >= {"transduce.serving.app", "transduce.serving.batching"}  # (it reads)
    assert circles(graph) == []


def _plan_entries() -> set[str]:
    """The folders (``name/``) and modules (``name.py``) that the plan in docs/design.md gives a paragraph each: the
    backticked names in the bold opening of each of its paragraphs."""
    plan = DESIGN.read_text(encoding="utf-8").split("\n## ")[1]
    assert plan.startswith("The plan"), "docs/design.md opens with the plan"
    openings = re.findall(r"^\*\*(.+?)\*\*", plan, re.M)
    return {name for opening in openings for name in re.findall(r"`([a-z_]+(?:/|\.py))`", opening)}


def test_the_plan_in_the_design_document_names_every_folder_and_top_level_module():
    present = {p.name + "/" for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    present |= {p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    assert _plan_entries() == present
    assert len(present) <= 18  # a plan a contributor reads in a minute
