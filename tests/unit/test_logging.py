"""Logging: JSON off a terminal, context bound via contextvars, secrets masked before rendering."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog
from pydantic import SecretStr

from warmer.core.model import BoxSpec, CacheLayout, CompletionReport, EngineKind, ModelProfile, Prefix
from warmer.root.logging import MASK, NOISY_LIBRARY_LOGGERS, configure_logging
from warmer.service.engine_work.warming import WarmExecutor


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    library_levels = {name: logging.getLogger(name).level for name in NOISY_LIBRARY_LOGGERS}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, library_level in library_levels.items():
        logging.getLogger(name).setLevel(library_level)
    structlog.reset_defaults()


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def test_auto_format_writes_json_when_not_a_terminal_with_bound_context() -> None:
    stream = io.StringIO()  # not a TTY
    configure_logging("INFO", "auto", stream)
    log = structlog.get_logger("warmer.test")
    with structlog.contextvars.bound_contextvars(box="llama-1", epoch="e7"):
        log.info("warm", agent="sales")
    log.info("after")
    first, second = lines(stream)
    assert (first["event"], first["box"], first["epoch"], first["agent"]) == (
        "warm",
        "llama-1",
        "e7",
        "sales",
    )
    assert first["level"] == "info"
    assert first["logger"] == "warmer.test"
    assert "box" not in second  # the context ends with the block


def test_console_format_is_not_json() -> None:
    stream = io.StringIO()
    configure_logging("INFO", "console", stream)
    structlog.get_logger("x").info("hello", box="b1")
    text = stream.getvalue()
    assert "hello" in text
    assert "b1" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.splitlines()[0])


def test_level_filters_and_stdlib_records_share_the_format() -> None:
    stream = io.StringIO()
    configure_logging("WARNING", "json", stream)
    structlog.get_logger("x").info("dropped")
    logging.getLogger("uvicorn.error").warning("from a library")
    (only,) = lines(stream)
    assert only["event"] == "from a library"
    assert only["logger"] == "uvicorn.error"


def test_secrets_are_masked_in_every_shape() -> None:
    stream = io.StringIO()
    configure_logging("INFO", "json", stream)
    structlog.get_logger("x").info(
        "loaded",
        token="plain-token-5555",
        webhook_secret=SecretStr("hook-secret-1111"),
        nested={"password": "pw-2222", "tokens": ["t-3333"], "ok": "visible"},
        url="postgresql+psycopg://warmer:db-password-9876@db:5432/warmer",
        secrets_list=[SecretStr("s-4444")],
    )
    text = stream.getvalue()
    for secret in ("plain-token-5555", "hook-secret-1111", "pw-2222", "t-3333", "db-password-9876", "s-4444"):
        assert secret not in text
    (line,) = lines(stream)
    assert line["url"] == f"postgresql+psycopg://warmer:{MASK}@db:5432/warmer"
    assert line["nested"] == {"password": MASK, "tokens": MASK, "ok": "visible"}
    # Same redaction applies to records from stdlib loggers (uvicorn, alembic).
    logging.getLogger("lib").info("connecting to %s", "postgresql://warmer:pw-7777@db/warmer")
    last = lines(stream)[-1]
    assert last["event"] == f"connecting to postgresql://warmer:{MASK}@db/warmer"


def test_counts_under_token_keys_stay_visible_and_credentials_stay_masked() -> None:
    stream = io.StringIO()
    configure_logging("INFO", "json", stream)
    structlog.get_logger("x").warning(
        "box hit rate below threshold",
        queried_tokens=5000.0,
        prefix_tokens=[1, 2, 3],
        window={"hit_tokens": 4000, "tokens": ["t-8888"]},
        token="tok-1212",
        password=1234,
        tokens=[],
    )
    (line,) = lines(stream)
    assert line["queried_tokens"] == 5000.0
    assert line["prefix_tokens"] == [1, 2, 3]
    assert line["window"] == {"hit_tokens": 4000, "tokens": MASK}
    assert (line["token"], line["password"], line["tokens"]) == (MASK, MASK, MASK)


def test_request_and_tick_lines_of_libraries_are_off_by_default() -> None:
    stream = io.StringIO()
    configure_logging("INFO", "json", stream)
    logging.getLogger("httpx").info('HTTP Request: POST http://b:1/completion "HTTP/1.1 200 OK"')
    logging.getLogger("apscheduler.executors.default").info('Running job "tick"')
    logging.getLogger("httpx").warning("a library problem")
    assert [line["event"] for line in lines(stream)] == ["a library problem"]

    configure_logging("INFO", "json", stream, library_level="INFO")
    logging.getLogger("httpx").info("HTTP Request: GET http://b:1/health")
    assert lines(stream)[-1]["event"] == "HTTP Request: GET http://b:1/health"


def test_lines_logged_during_a_warm_carry_the_box_and_prefix() -> None:
    """What an engine adapter or httpx logs inside a warm is tagged through structlog contextvars."""

    class LoggingEngine:
        async def cache_layout(self, box: BoxSpec) -> CacheLayout:
            return CacheLayout()

        async def complete_prefix(
            self, box: BoxSpec, prefix: Prefix, *, suffix: str = "", max_tokens: int = 1, **_: object
        ) -> CompletionReport:
            logging.getLogger("httpx").warning("slow answer")
            return CompletionReport(prompt_tokens=100, cached_tokens=100 if suffix else 0, wall_seconds=0.1)

    class Clock:
        def monotonic(self) -> float:
            return 0.0

    stream = io.StringIO()
    configure_logging("INFO", "json", stream)
    box = BoxSpec(id="llama-3", base_url="http://b:1", engine=EngineKind.LLAMACPP, model="m")
    prefix = Prefix(text="You are Robin." * 10, token_count=100)
    executor = WarmExecutor(LoggingEngine(), Clock())  # type: ignore[arg-type]
    outcome = asyncio.run(
        executor.warm_and_verify(box, ModelProfile(name="m", engine=EngineKind.LLAMACPP), prefix)
    )
    assert outcome.verified
    logged = lines(stream)
    assert logged
    assert {(line["box"], line["prefix"]) for line in logged} == {("llama-3", prefix.hash)}
    logging.getLogger("httpx").warning("outside any warm")
    assert "box" not in lines(stream)[-1]
