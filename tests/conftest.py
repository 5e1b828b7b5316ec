"""Shared pytest fixtures. Keep each block small and self-contained: several areas add fixtures here."""

from __future__ import annotations

import asyncio
import asyncio.runners
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testbed.fleet import LlamaFleet
from testbed.llama_build import ensure_llama_server
from testbed.tiny_hf_model import ensure_tiny_hf_model
from testbed.tiny_model import ensure_tiny_model
from testbed.vllm_server import VllmServer

# -- no asyncio task outlives the test that started it --------------------------------------------------
# `asyncio.run` cancels whatever is still running when its coroutine returns, so a task a test (or the code
# under test) forgot would vanish silently. The runner's cancel step is wrapped to note those tasks first.


@pytest.fixture(autouse=True)
def no_leaked_tasks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    leaked: list[str] = []
    cancel_all = asyncio.runners._cancel_all_tasks  # type: ignore[attr-defined]

    def noting_leaks(loop: asyncio.AbstractEventLoop) -> None:
        running = [task for task in asyncio.all_tasks(loop) if not task.done()]
        leaked.extend(sorted(f"{task.get_name()}: {task.get_coro()!r}" for task in running))
        cancel_all(loop)

    monkeypatch.setattr(asyncio.runners, "_cancel_all_tasks", noting_leaks)
    yield
    if leaked:
        pytest.fail("asyncio tasks still running when the test's event loop ended:\n  " + "\n  ".join(leaked))


# -- per-test timeouts: short for unit tests, longer for tests against real processes ------------------


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`timeout` in pyproject bounds a unit test; integration tests start engines and databases."""
    for item in items:
        if item.get_closest_marker("integration") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(INTEGRATION_TIMEOUT_SECONDS))


INTEGRATION_TIMEOUT_SECONDS = 900


# -- real llama-server boxes (testbed) ----------------------------------------------------------------
# Never skipped: a missing binary is built (about 9 minutes, once per machine), as CI relies on.


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    return ensure_llama_server()


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    return ensure_tiny_model()


LlamaFleetFactory = Callable[..., LlamaFleet]


@pytest.fixture
def llama_fleet_factory(
    llama_server_binary: Path, tiny_model_path: Path, tmp_path: Path
) -> Iterator[LlamaFleetFactory]:
    """`factory(n, *, slots=1, ctx_per_slot=4096, cache_ram_mib=0)` starts n healthy boxes (`cache_ram_mib`
    > 0: each with a host prompt cache of that many MiB); all are stopped at teardown."""
    fleets: list[LlamaFleet] = []

    def start(n: int, *, slots: int = 1, ctx_per_slot: int = 4096, cache_ram_mib: int = 0) -> LlamaFleet:
        fleet = LlamaFleet(
            n,
            binary=llama_server_binary,
            model=tiny_model_path,
            slots=slots,
            ctx_per_slot=ctx_per_slot,
            cache_ram_mib=cache_ram_mib,
            log_dir=tmp_path / f"llama-fleet-{len(fleets)}",
        )
        fleets.append(fleet)
        fleet.start()
        return fleet

    yield start
    for fleet in fleets:
        fleet.stop()


# -- databases for the store suite: a SQLite file and a throwaway PostgreSQL database -------------------
# PostgreSQL is the real server on 127.0.0.1:5432 (CI provides it); WARMER_TEST_POSTGRES_URL names a
# database on another server where the tests may CREATE DATABASE. Never skipped.

DEFAULT_TEST_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty, unmigrated database for one test, on each backend in turn; dropped afterwards."""
    import os
    import uuid

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'warmer-test.db'}"
        return
    admin_url = make_url(os.environ.get("WARMER_TEST_POSTGRES_URL", DEFAULT_TEST_POSTGRES_URL))
    if admin_url.drivername in ("postgresql", "postgres"):
        admin_url = admin_url.set(drivername="postgresql+psycopg")
    name = f"warmer_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        yield admin_url.set(database=name).render_as_string(hide_password=False)
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


# -- a real vLLM (CPU) server on the tiny HF model (testbed) --------------------------------------------
# Never skipped: a missing install is made (about 8 minutes, once per machine). Start-up takes 30-140 s, so
# the whole session shares ONE server; tests use their own unique prompts instead of a fresh cache.


@pytest.fixture(scope="session")
def tiny_hf_model_path() -> Path:
    return ensure_tiny_hf_model()


@pytest.fixture(scope="session")
def vllm_server(tiny_hf_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """The session's vLLM server (`base_url`, `pid`, `served_model_name` "tiny", block size 128)."""
    server = VllmServer(tiny_hf_model_path, workdir=tmp_path_factory.mktemp("vllm"))
    with server:
        yield server


@pytest.fixture
def vllm_restartable(vllm_server: VllmServer) -> Iterator[VllmServer]:
    """The same session server, for a test that calls `restart()`/`stop()`; it is running again afterwards.

    Sharing it avoids a second 30-140 s start-up; the port (so `base_url`) survives restarts.
    """
    yield vllm_server
    vllm_server.start()  # no-op when it is already up
