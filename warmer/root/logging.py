"""Structured logging: structlog for our code and the stdlib loggers of libraries (uvicorn), one format.

JSON lines when stderr is not a terminal (journald, Kubernetes), a readable console otherwise. Context
such as box, agent and epoch is bound with `structlog.contextvars.bound_contextvars(box=...)` and merged
into every line logged inside that block. Secrets are masked by a processor before rendering; counts
under credential-like words (`queried_tokens=5000`) are numbers, never secrets, and stay visible.

Libraries that log a line per HTTP request (httpx, httpcore) or per timer tick (APScheduler) are held at
`library_level` (WARNING by default): the daemon logs state changes itself, with their causes.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping
from typing import Any, Literal, TextIO

import structlog
from pydantic import SecretBytes, SecretStr
from structlog.typing import EventDict, Processor, WrappedLogger

MASK = "**********"
# Keys whose values are credentials whatever their type.
_SECRET_KEYS = re.compile(r"(pass(word)?|secret|token|authorization|api[_-]?key|credential)", re.IGNORECASE)
# Loggers that write one line per engine request or per scheduler tick at INFO.
NOISY_LIBRARY_LOGGERS = ("httpx", "httpcore", "apscheduler")
_ALWAYS_SECRET_KEYS = re.compile(r"(pass(word)?|secret|authorization|api[_-]?key|credential)", re.IGNORECASE)
# `scheme://user:password@host` -> keep the user, drop the password.
_URL_PASSWORD = re.compile(
    r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*:)(?P<password>[^@\s]+)(?=@)", re.IGNORECASE
)


def _masked(value: Any) -> Any:
    if isinstance(value, SecretStr | SecretBytes):
        return MASK
    if isinstance(value, str):
        return _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, value)
    if isinstance(value, Mapping):
        return {key: MASK if _hides_secret(key, item) else _masked(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_masked(item) for item in value]
    return value


def _is_count(value: object) -> bool:
    """A number, or a list of them (token counts, token ids): what `*_tokens` keys carry."""
    if isinstance(value, list | tuple):
        return bool(value) and all(_is_count(item) for item in value)
    return isinstance(value, int | float) and not isinstance(value, bool)


def _hides_secret(key: object, value: object) -> bool:
    """A value under a credential-like key. "token" is also the LLM's unit: a count under it
    (`queried_tokens=5000`, `prefix_tokens=[1, 2]`) is shown; a password-like key is masked whatever it
    holds."""
    if value is None or not isinstance(key, str) or not _SECRET_KEYS.search(key):
        return False
    return not (_is_count(value) and not _ALWAYS_SECRET_KEYS.search(key))


def redact_secrets(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Mask secret-typed values, values under credential-like keys, and passwords inside URLs."""
    for key, value in list(event_dict.items()):
        event_dict[key] = MASK if _hides_secret(key, value) else _masked(value)
    return event_dict


def _use_json(fmt: Literal["auto", "json", "console"], stream: TextIO) -> bool:
    if fmt == "auto":
        isatty = getattr(stream, "isatty", None)
        return not (callable(isatty) and isatty())
    return fmt == "json"


def configure_logging(
    level: str = "INFO",
    fmt: Literal["auto", "json", "console"] = "auto",
    stream: TextIO | None = None,
    library_level: str = "WARNING",
) -> None:
    """Route structlog and stdlib logging to `stream` (stderr) in one format. Call once per process.

    `library_level` applies to NOISY_LIBRARY_LOGGERS (never below `level`)."""
    stream = stream if stream is not None else sys.stderr
    level_number = logging.getLevelNamesMapping()[level.upper()]
    as_json = _use_json(fmt, stream)
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        redact_secrets,
    ]
    renderer: Processor = (
        structlog.processors.JSONRenderer()
        if as_json
        else structlog.dev.ConsoleRenderer(colors=bool(getattr(stream, "isatty", lambda: False)()))
    )
    final: list[Processor] = [structlog.stdlib.ProcessorFormatter.remove_processors_meta]
    if as_json:
        final.append(structlog.processors.format_exc_info)
    final.append(renderer)

    handler = logging.StreamHandler(stream)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(foreign_pre_chain=shared, processors=final))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level_number)
    # uvicorn's loggers carry their own handlers when it configures logging; we pass log_config=None, so
    # they propagate here. Access logs stay off: one line per probe is noise.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True

    library_number = max(level_number, logging.getLevelNamesMapping()[library_level.upper()])
    for name in NOISY_LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(library_number)

    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(level_number),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    """A logger named after its module (shown as `logger` in each line)."""
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(name)
    return logger


__all__ = ["MASK", "NOISY_LIBRARY_LOGGERS", "configure_logging", "get_logger", "redact_secrets"]
