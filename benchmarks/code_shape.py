"""The shape of rem's backend code: function lengths and module sizes, measured with Python's `ast`.

    python benchmarks/code_shape.py [--json] [--over 60] [--root backend]

A function's length runs from its `def` line to its last line (decorators not
counted, nested functions counted on their own as well as inside their
parent), the method the code-health review reported with. Prints the median, p90 and max
of every function under the root, the functions longer than `--over`, and
the modules longer than 600 lines. `tests/backend/test_code_shape.py` holds
the limits to this same measurement.
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FUNCTION_LIMIT = 60  # lines, `def` to the last line
MODULE_LIMIT = 600  # lines


@dataclass(frozen=True)
class Function:
    module: str  # the path from the project root, e.g. backend/ops/status.py
    name: str  # qualified within its module: Class.method, outer.inner
    lines: int


def functions_of(path: Path, relative: str) -> list[Function]:
    """Every function and method in one file, with its length from `def` to its last line."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[Function] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                end = child.end_lineno or child.lineno
                found.append(Function(relative, name, end - child.lineno + 1))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def source_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def measure(root: Path = ROOT / "backend") -> tuple[list[Function], dict[str, int]]:
    """Every function under `root`, and every module's line count (paths from the project root)."""
    functions: list[Function] = []
    modules: dict[str, int] = {}
    for path in source_files(root):
        relative = path.relative_to(ROOT).as_posix()
        modules[relative] = len(path.read_text(encoding="utf-8").splitlines())
        functions += functions_of(path, relative)
    return functions, modules


def percentile(values: list[int], fraction: float) -> int:
    """The nearest-rank percentile (p90 of 1..10 is 9): a line count that some function has."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * int(fraction * 100) // 100))
    return ordered[rank - 1]


def summary(root: Path, over: int) -> dict[str, object]:
    functions, modules = measure(root)
    lengths = [f.lines for f in functions]
    long = sorted((f for f in functions if f.lines > over), key=lambda f: (-f.lines, f.module, f.name))
    return {
        "root": root.relative_to(ROOT).as_posix(),
        "functions": len(functions),
        "median": statistics.median_low(lengths),
        "p90": percentile(lengths, 0.9),
        "max": max(lengths),
        f"over_{over}": [{"module": f.module, "name": f.name, "lines": f.lines} for f in long],
        f"modules_over_{MODULE_LIMIT}": {m: n for m, n in sorted(modules.items()) if n > MODULE_LIMIT},
        "largest_module": max(modules.items(), key=lambda kv: kv[1]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--over", type=int, default=FUNCTION_LIMIT, help="list functions longer than this")
    parser.add_argument("--root", default="backend", help="the directory to measure, from the project root")
    args = parser.parse_args(argv)
    result = summary(ROOT / args.root, args.over)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"{result['root']}: {result['functions']} functions, lines median {result['median']} / "
        f"p90 {result['p90']} / max {result['max']}; largest module {result['largest_module']}"
    )
    for f in result[f"over_{args.over}"]:  # type: ignore[attr-defined]
        print(f"  function {f['lines']:4d}  {f['module']}:{f['name']}")
    for module, n in result[f"modules_over_{MODULE_LIMIT}"].items():  # type: ignore[attr-defined]
        print(f"  module   {n:4d}  {module}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
