"""Every HTTP client warmer opens comes from `warmer.root.http`: no proxy or CA bundle from the environment,
no redirects followed, warmer's user agent — for the daemon's engine client as much as for the CLI's."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

import warmer
from warmer.config.settings import Settings
from warmer.root.app import build
from warmer.root.http import http_client, sync_http_client

WARMER = Path(warmer.__file__).resolve().parent


class _Handler(BaseHTTPRequestHandler):
    agents: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.agents.append(self.headers.get("user-agent", ""))
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("location", "/elsewhere")
        else:
            self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A local server, with the environment pointing every request at a proxy that does not exist."""
    _Handler.agents = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:1")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_the_async_client_ignores_the_environment_proxy_follows_no_redirect_and_names_warmer(
    server: str,
) -> None:
    async def scenario() -> tuple[int, int]:
        async with http_client(base_url=server) as client:
            return (await client.get("/")).status_code, (await client.get("/moved")).status_code

    assert asyncio.run(scenario()) == (200, 302)
    assert _Handler.agents == [f"warmer/{warmer.__version__}"] * 2


def test_the_cli_client_has_the_same_settings(server: str) -> None:
    with sync_http_client(base_url=server, headers={"authorization": "Bearer t"}) as client:
        assert (client.get("/").status_code, client.get("/moved").status_code) == (200, 302)
    assert _Handler.agents == [f"warmer/{warmer.__version__}"] * 2


def test_the_daemons_engine_client_ignores_the_environment(tmp_path: Path) -> None:
    daemon = build(Settings(database={"state_dir": str(tmp_path)}))
    try:
        assert daemon.http.trust_env is False
        assert daemon.http.follow_redirects is False
    finally:
        asyncio.run(daemon.http.aclose())


def test_no_module_makes_a_client_of_its_own() -> None:
    pattern = re.compile(r"httpx\.(Async)?Client\(")
    makers = sorted(
        str(path.relative_to(WARMER))
        for path in WARMER.rglob("*.py")
        if pattern.search(path.read_text(encoding="utf-8"))
    )
    assert makers == ["root/http.py"]
