"""Installed from a wheel, as a new user would: built from the checkout, installed with the pinned
constraints into a clean virtualenv outside the repository, and started from an empty directory holding
nothing but what `warmer init` writes. It must serve, migrate its own database, and warm a real
llama-server box, with the model profile, tokenizer file and migrations all coming from the wheel."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from testbed.fleet import free_loopback_port
from tests.conftest import LlamaFleetFactory

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# Bounds for a loaded 2-core machine (dependency downloads included), not performance expectations.
INSTALL_TIMEOUT_SECONDS = 900
START_TIMEOUT_SECONDS = 120
READY_TIMEOUT_SECONDS = 240


def _run(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{argv} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def _outside_env() -> dict[str, str]:
    """The caller's environment without anything that would let the checkout leak in."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("WARMER_", "PYTHON", "VIRTUAL_ENV"))
    }


def _copy_source(target: Path) -> Path:
    """The checkout's files as git sees them (tracked and new, not ignored): never a stale build/ dir."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the clean venv's bin directory with warmer installed from it)."""
    root = tmp_path_factory.mktemp("wheel-install")
    env = _outside_env()
    source = _copy_source(root / "src")
    dist = root / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(source)],
        cwd=root,
        env=env,
        timeout=INSTALL_TIMEOUT_SECONDS,
    )
    (wheel,) = dist.glob("warmer-*.whl")
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=root, env=env)
    _run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "-c", str(REPO / "constraints.txt"), str(wheel)],
        cwd=root,
        env=env,
        timeout=INSTALL_TIMEOUT_SECONDS,
    )
    return wheel, venv / "bin"


def test_the_wheel_carries_profiles_tokenizer_and_migrations(installed: tuple[Path, Path]) -> None:
    wheel, _bin = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    for profile in (REPO / "models").iterdir():
        assert f"warmer/models/{profile.name}" in names
    for migration in (REPO / "migrations").rglob("*"):
        if migration.is_file() and "__pycache__" not in migration.parts:
            assert f"warmer/migrations/{migration.relative_to(REPO / 'migrations')}" in names
    assert not [name for name in names if name.startswith(("tests/", "testbed/", "bench/"))]


def test_init_output_alone_serves_and_warms_a_real_box(
    installed: tuple[Path, Path], tmp_path: Path, llama_fleet_factory: LlamaFleetFactory
) -> None:
    _wheel, bin_dir = installed
    warmer = str(bin_dir / "warmer")
    env = _outside_env()
    home = tmp_path / "empty"
    home.mkdir()
    imported = _run(
        [str(bin_dir / "python"), "-c", "import warmer; print(warmer.__file__)"], cwd=home, env=env
    )
    assert str(bin_dir.parent) in imported, imported
    assert str(REPO) not in imported, imported

    (box,) = llama_fleet_factory(1, slots=2).boxes
    port = free_loopback_port()
    _run([warmer, "init", "--box", box.base_url, "--port", str(port)], cwd=home, env=env)
    checked = _run([warmer, "--config", "warmer.toml", "check-config"], cwd=home, env=env)
    assert "config ok" in checked, checked
    assert "1 agents" in checked, checked
    linted = _run([warmer, "--config", "warmer.toml", "lint"], cwd=home, env=env)
    assert linted.startswith("example (tiny-demo): "), linted  # the shipped tokenizer file renders it
    _run([warmer, "--config", "warmer.toml", "db", "upgrade"], cwd=home, env=env)
    assert (home / "state" / "warmer.db").is_file()

    base_url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [warmer, "--config", "warmer.toml", "serve"],
            cwd=home,
            env={**env, "WARMER_LOGGING__FORMAT": "json"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait(process, log_path, START_TIMEOUT_SECONDS, lambda: _status(f"{base_url}/healthz") == 200)
        assert _status(f"{base_url}/readyz") == 200
        _wait(
            process,
            log_path,
            READY_TIMEOUT_SECONDS,
            lambda: _status(f"{base_url}/v1/boxes/box-1/ready") == 200,
        )
        routes = httpx.get(f"{base_url}/v1/routes", timeout=10).json()["routes"]
        assert [route["box_id"] for route in routes["example"]["routes"]] == ["box-1"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, log_path.read_text()[-5000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.TransportError:
        return 0


def _wait(process: subprocess.Popen[bytes], log: Path, timeout: float, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"serve exited {process.returncode}:\n{log.read_text()[-5000:]}"
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s:\n{log.read_text()[-5000:]}")
