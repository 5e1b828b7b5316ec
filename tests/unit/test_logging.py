"""Logging: JSON off a terminal, context bound via contextvars, secrets masked before rendering."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog
from pydantic import SecretStr

from warmer.root.logging import MASK, configure_logging


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
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
