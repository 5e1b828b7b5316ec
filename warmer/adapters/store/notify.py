"""LISTEN on PostgreSQL for the changes other replicas write (`coordination.CHANGES_CHANNEL`).

One dedicated autocommit connection (psycopg 3, outside the pool: a listening connection must stay open).
A lost connection is re-opened with a capped backoff; a notification missed meanwhile only delays the
change to the next pass, since the store, not the message, is the truth. After each (re)connect the
callback runs once, as if notified: whatever happened while nobody listened is picked up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from warmer.adapters.store.coordination import CHANGES_CHANNEL

RECONNECT_MIN_SECONDS = 0.5
RECONNECT_MAX_SECONDS = 10.0


def libpq_url(sqlalchemy_url: str) -> str:
    """A `postgresql+psycopg://...` SQLAlchemy URL as the libpq URI psycopg connects with."""
    return make_url(sqlalchemy_url).set(drivername="postgresql").render_as_string(hide_password=False)


async def listen_for_changes(
    sqlalchemy_url: str,
    on_change: Callable[[str], None],
    stopping: asyncio.Event,
    *,
    channel: str = CHANGES_CHANNEL,
    on_trouble: Callable[[str], None] | None = None,
) -> None:
    """Call `on_change(payload)` for every notification on `channel` until `stopping` is set; connection
    trouble is told to `on_trouble` (the caller logs it) and retried."""
    trouble = on_trouble or (lambda _message: None)
    url = libpq_url(sqlalchemy_url)
    backoff = RECONNECT_MIN_SECONDS
    while not stopping.is_set():
        try:
            connection = await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=5)
        except psycopg.Error as exc:
            trouble(f"change listener cannot connect ({type(exc).__name__}); retrying in {backoff:g}s")
        else:
            try:
                async with connection:
                    await connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    backoff = RECONNECT_MIN_SECONDS
                    on_change("listening")
                    await _pump(connection, on_change, stopping)
            except psycopg.Error as exc:
                trouble(f"change listener lost its connection ({type(exc).__name__})")
        if stopping.is_set():
            return
        try:
            await asyncio.wait_for(stopping.wait(), backoff)
        except TimeoutError:
            backoff = min(RECONNECT_MAX_SECONDS, backoff * 2)


async def _pump(
    connection: psycopg.AsyncConnection[tuple[object, ...]],
    on_change: Callable[[str], None],
    stopping: asyncio.Event,
) -> None:
    """Deliver notifications until `stopping` (the generator is closed by cancelling its reader)."""

    async def read() -> None:
        async for notification in connection.notifies():
            on_change(notification.payload)

    reader = asyncio.ensure_future(read())
    stop = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait({reader, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not reader.done():
            reader.cancel()
        await asyncio.gather(reader, stop, return_exceptions=True)
    if reader.done() and not reader.cancelled() and reader.exception() is not None:
        exc = reader.exception()
        assert exc is not None
        raise exc
