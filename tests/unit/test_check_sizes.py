"""The size rule `make lint` runs (scripts/check_sizes.py), on sources made for the purpose."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_sizes.py"


def checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_sizes", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def function(name: str, lines: int, *, indent: str = "") -> str:
    body = "".join(f"{indent}    x{n} = {n}\n" for n in range(lines - 1))
    return f"{indent}def {name}() -> None:\n{body}"


def test_a_long_module_passes_only_with_a_size_line_in_its_docstring(tmp_path: Path) -> None:
    check = checker()
    package = tmp_path / "warmer"
    (package / "core").mkdir(parents=True)
    filler = "".join(f"X{n} = {n}\n" for n in range(check.MODULE_LINES))
    (package / "big.py").write_text('"""Big."""\n' + filler)
    reasoned = '"""Reasoned.\n\nSize: one table, read top to bottom.\n"""\n'
    (package / "reasoned.py").write_text(reasoned + filler)
    (package / "small.py").write_text('"""Small."""\nX = 1\n')
    found = check.problems(package, package / "core")
    lines = check.MODULE_LINES + 1
    assert found == [f"warmer/big.py: {lines} lines (over 400) and no `Size:` line in its docstring"]


def test_long_functions_are_found_in_the_core_only_methods_and_nested_ones_included(tmp_path: Path) -> None:
    check = checker()
    package = tmp_path / "warmer"
    (package / "core").mkdir(parents=True)
    limit = check.FUNCTION_LINES
    core_source = (
        '"""Core."""\n'
        + function("fits", limit)
        + function("too_long", limit + 1)
        + "class Rules:\n"
        + function("method", limit + 5, indent="    ")
    )
    (package / "core" / "rules.py").write_text(core_source)
    (package / "service.py").write_text('"""Service."""\n' + function("long_but_not_core", limit + 10))
    assert check.problems(package, package / "core") == [
        f"warmer/core/rules.py:{limit + 2}: too_long is {limit + 1} lines (over {limit})",
        f"warmer/core/rules.py:{2 * limit + 4}: Rules.method is {limit + 5} lines (over {limit})",
    ]
    nested = ast.parse(function("outer", 3) + "    " + function("inner", limit + 1, indent="    ").lstrip())
    assert [name for name, _, _ in check.long_functions(nested)] == ["outer", "outer.inner"]
