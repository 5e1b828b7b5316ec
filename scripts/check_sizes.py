"""Size limits that keep each behaviour findable: `python scripts/check_sizes.py` (run by `make lint`).

- A module in warmer/ over MODULE_LINES lines must say why at its top: a line of its module docstring that
  starts with `Size:` (for example "Size: one table of every setting, so each default is documented once").
- A function in warmer/core (the pure rules) may not exceed FUNCTION_LINES lines, with no exception: a
  longer one is several rules that want names of their own.

Exit status 1 lists every module and function over its limit.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

MODULE_LINES = 400
FUNCTION_LINES = 60
ROOT = Path(__file__).resolve().parent.parent


def states_its_size(tree: ast.Module) -> bool:
    docstring = ast.get_docstring(tree) or ""
    return any(line.strip().startswith("Size:") for line in docstring.splitlines())


def long_functions(tree: ast.Module, limit: int = FUNCTION_LINES) -> Iterator[tuple[str, int, int]]:
    """(qualified name, first line, length) of every function or method longer than `limit` lines."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                length = (child.end_lineno or child.lineno) - start + 1
                if length > limit:
                    yield name, start, length
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")

    yield from walk(tree, "")


def problems(package: Path, core: Path) -> list[str]:
    found: list[str] = []
    for path in sorted(package.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source, filename=str(path))
        lines = len(source.splitlines())
        shown = path.relative_to(package.parent)
        if lines > MODULE_LINES and not states_its_size(tree):
            found.append(f"{shown}: {lines} lines (over {MODULE_LINES}) and no `Size:` line in its docstring")
        if path.is_relative_to(core):
            for name, start, length in long_functions(tree):
                found.append(f"{shown}:{start}: {name} is {length} lines (over {FUNCTION_LINES})")
    return found


def main() -> int:
    found = problems(ROOT / "warmer", ROOT / "warmer" / "core")
    for problem in found:
        print(problem, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
