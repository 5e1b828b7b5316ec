"""Where slow, machine-specific builds are cached: outside the repository, keyed by version and CPU."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_root() -> Path:
    """`WARMER_TESTBED_CACHE`, else `$XDG_CACHE_HOME/warmer-testbed`, else `~/.cache/warmer-testbed`."""
    explicit = os.environ.get("WARMER_TESTBED_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "warmer-testbed"


def cpu_key() -> str:
    """A short digest of the CPU model and flags: builds use -march=native, so they are per CPU."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown-cpu"
    wanted = [line for line in text.splitlines() if line.startswith(("model name", "flags"))]
    first_cpu = "\n".join(sorted(set(wanted)))
    return hashlib.sha256(first_cpu.encode()).hexdigest()[:12]
