"""The import contracts are an allowlist: every third-party package warmer imports has a `protected`
contract in pyproject.toml naming who may import it, so a new dependency cannot slip into any layer
without a rule saying where it belongs."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]


def _contracts() -> list[dict[str, object]]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts: list[dict[str, object]] = data["tool"]["importlinter"]["contracts"]
    return contracts


def _third_party_imported_by_warmer() -> set[str]:
    graph = grimp.build_graph("warmer", include_external_packages=True)
    return {
        module
        for module in graph.modules
        if not module.startswith("warmer")
        and module not in sys.stdlib_module_names
        and graph.find_modules_that_directly_import(module)
    }


def _protected() -> set[str]:
    names: set[str] = set()
    for contract in _contracts():
        if contract["type"] == "protected":
            modules = contract["protected_modules"]
            assert isinstance(modules, list)
            names.update(modules)
    return names


def test_every_third_party_package_warmer_imports_has_an_allowlist_contract() -> None:
    unlisted = _third_party_imported_by_warmer() - _protected()
    assert not unlisted, f"add a `protected` contract naming who may import: {sorted(unlisted)}"


def test_the_allowlist_names_only_packages_warmer_imports() -> None:
    stale = _protected() - _third_party_imported_by_warmer()
    assert not stale, f"no module imports these any more; drop their contracts: {sorted(stale)}"


def test_the_purity_contracts_check_indirect_imports() -> None:
    forbidden = [c for c in _contracts() if c["type"] == "forbidden"]
    assert forbidden
    assert all(c.get("allow_indirect_imports") is False for c in forbidden), [
        c["name"] for c in forbidden if c.get("allow_indirect_imports") is not False
    ]
