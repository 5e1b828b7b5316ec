"""Where the data shipped with warmer lives: the default model profiles and the Alembic migrations.

The repository keeps them at its root (`models/`, `migrations/`); the wheel carries them inside the
package (`warmer/models`, `warmer/migrations`, see setup.py). An installed daemon and a checkout find
them through this one function, so neither layout needs a config entry to start.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

_PACKAGE = Path(__file__).resolve().parent

ShippedDir = Literal["models", "migrations"]


def shipped_dir(name: ShippedDir) -> Path:
    """The directory `name` inside the installed package, else at the root of the checkout `warmer` runs
    from (recognised by its pyproject.toml, so a stray `models/` next to site-packages is never used)."""
    installed = _PACKAGE / name
    if installed.is_dir():
        return installed
    checkout = _PACKAGE.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / name).is_dir():
        return checkout / name
    raise FileNotFoundError(f"warmer's shipped {name}/ directory is missing (looked in {installed})")
