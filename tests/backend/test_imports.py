"""The import graph of backend/ and tui/, read with `ast`: every import statement counts, those inside
functions and under TYPE_CHECKING included (import-linter's layer contract sees the same edges).

* No module imports itself back through others: the graph has no cycle.
* An import inside a function is there because import time demands it, and says so: a
  `# import time: ...` comment on its line, or on the line right above its group of imports.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("backend", "tui")
MARK = "# import time:"


@dataclass(frozen=True)
class Source:
    name: str  # dotted module name (a package is its __init__)
    path: Path
    tree: ast.Module
    lines: list[str]


def sources() -> dict[str, Source]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            text = path.read_text()
            found[".".join(parts)] = Source(".".join(parts), path, ast.parse(text), text.splitlines())
    return found


def _owner(name: str, modules: dict[str, Source]) -> str | None:
    """The module of ours `name` is, or is in (`backend.ops.actions.status` -> `backend.ops.actions`)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imported_by(source: Source, modules: dict[str, Source]) -> set[str]:
    """The modules of ours that `source` imports, wherever its import statements stand."""
    package = source.name if source.path.name == "__init__.py" else source.name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(source.tree):
        if isinstance(node, ast.Import):
            found.update(filter(None, (_owner(alias.name, modules) for alias in node.names)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package
                for _ in range(node.level - 1):
                    parent = parent.rpartition(".")[0]
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:  # `from backend.store import schema` imports a module
                full = f"{base}.{alias.name}"
                owner = full if full in modules else _owner(base, modules)
                if owner:
                    found.add(owner)
    found.discard(source.name)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
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
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
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


def in_function_imports(source: Source) -> Iterator[ast.Import | ast.ImportFrom]:
    for function in ast.walk(source.tree):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(function):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    yield node


def unexplained(source: Source) -> list[str]:
    """In-function imports with no `# import time:` comment on their line or above their group."""
    imports = sorted(set(in_function_imports(source)), key=lambda n: n.lineno)
    ends = {node.end_lineno: node for node in imports}
    missing = []
    for node in imports:
        assert node.end_lineno is not None
        if any(MARK in source.lines[i - 1] for i in range(node.lineno, node.end_lineno + 1)):
            continue
        above = node.lineno - 1
        while above in ends or (not source.lines[above - 1].strip() and above - 1 in ends):
            # up through the group of imports this one ends (isort may part it with a blank line)
            above = ends[above].lineno - 1 if above in ends else above - 1
        if above >= 1 and source.lines[above - 1].strip().startswith(MARK):
            continue
        missing.append(f"{source.path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return missing


def test_the_finder_sees_imports_inside_functions_and_the_cycle_finder_finds_cycles() -> None:
    """The checks below could fail: a hidden import is found, a cycle of three is reported."""
    text = (
        "def f():\n"
        "    from backend.store import schema_pg\n"
        "\n"
        "    # import time: the library, not for --help\n"
        "    import backend.ops\n"
        "    from backend.ops import actions\n"
    )
    fake = Source("backend.store.schema", ROOT / "fake.py", ast.parse(text), text.splitlines())
    modules = {name: fake for name in ("backend.store.schema_pg", "backend.store.schema", "backend.ops")}
    assert imported_by(fake, modules) == {"backend.store.schema_pg", "backend.ops"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert unexplained(fake) == ["fake.py:2: from backend.store import schema_pg"]


def test_no_module_imports_itself_back_in_functions_included() -> None:
    modules = sources()
    graph = {name: imported_by(source, modules) for name, source in modules.items()}
    assert sum(len(edges) for edges in graph.values()) > 500  # the walk really saw the code
    assert cycles(graph) == []


def test_every_import_inside_a_function_says_why_import_time_demands_it() -> None:
    modules = sources()
    missing = [line for source in modules.values() for line in unexplained(source)]
    assert missing == [], "\n".join(missing)


def test_no_ops_module_shadows_an_operation_of_the_same_name() -> None:
    # `backend.ops.NAME` is loaded on first use; a submodule called NAME, once imported, would be
    # set on the package in its place and `ops.NAME(...)` would call a module
    import backend.ops

    ops_dir = Path(backend.ops.__file__).parent
    assert [name for name in backend.ops.__all__ if (ops_dir / f"{name}.py").exists()] == []
