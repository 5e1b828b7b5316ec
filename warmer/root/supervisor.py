"""Named root tasks, supervised: one dies -> say why, stop the rest, exit non-zero.

Each root task is `async def task(stopping: asyncio.Event) -> None` and runs until `stopping` is set, then
returns. SIGTERM/SIGINT set `stopping`; tasks get `grace_seconds` to finish, then are cancelled. A second
signal cancels at once. A task that returns or raises before a stop was asked for is fatal.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from warmer.root.logging import get_logger

RootTask = Callable[[asyncio.Event], Awaitable[None]]

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def _until(event: asyncio.Event) -> None:
    await event.wait()


class RootTaskExited(RuntimeError):
    """A root task tried to end the process (`sys.exit`) instead of returning or raising."""


class Supervisor:
    """Runs named root tasks until a signal, a stop request, or the first task failure."""

    def __init__(
        self,
        *,
        grace_seconds: float,
        on_task_failure: Callable[[str], None] | None = None,
    ) -> None:
        self._grace_seconds = grace_seconds
        self._on_task_failure = on_task_failure
        self._tasks: dict[str, RootTask] = {}
        self._stopping: asyncio.Event | None = None
        self._force: asyncio.Event | None = None
        self._stop_reason: str | None = None
        self._log = get_logger(__name__)

    def add(self, name: str, task: RootTask) -> None:
        """Register a root task under a unique name (shown in logs when it fails)."""
        if name in self._tasks:
            raise ValueError(f"root task {name!r} is already registered")
        self._tasks[name] = task

    @property
    def task_names(self) -> tuple[str, ...]:
        """The registered root tasks, in start order."""
        return tuple(self._tasks)

    @property
    def stop_reason(self) -> str | None:
        return self._stop_reason

    def request_stop(self, reason: str) -> None:
        """Begin a graceful stop (idempotent); a second request while stopping cancels at once."""
        if self._stopping is None or self._force is None:
            return
        if self._stopping.is_set():
            if not self._force.is_set():
                self._log.warning("stopping now, without waiting", reason=reason)
                self._force.set()
            return
        self._stop_reason = reason
        self._log.info("stopping", reason=reason, grace_seconds=self._grace_seconds)
        self._stopping.set()

    def _guarded(self, name: str, task: RootTask, stopping: asyncio.Event) -> Coroutine[Any, Any, None]:
        async def run() -> None:
            try:
                await task(stopping)
            except SystemExit as exc:
                # SystemExit escaping a task would tear down the event loop without any cleanup.
                raise RootTaskExited(f"root task {name!r} called sys.exit({exc.code})") from None

        return run()

    def _note_end(self, name: str, task: asyncio.Task[None], *, expected: bool) -> bool:
        """Log how a task ended; True when that is a failure."""
        if task.cancelled():
            if expected:
                return False
            self._log.error("root task was cancelled", task=name)
        elif (error := task.exception()) is not None:
            self._log.error(
                "root task failed", task=name, error=f"{type(error).__name__}: {error}", exc_info=error
            )
        elif not expected:
            self._log.error("root task ended on its own", task=name)
        else:
            self._log.info("root task stopped", task=name)
            return False
        if self._on_task_failure is not None:
            self._on_task_failure(name)
        return True

    async def run(self, *, handle_signals: bool = True) -> int:
        """Run every task to the end; 0 after a requested stop with no failures, 1 otherwise."""
        if not self._tasks:
            raise ValueError("no root tasks registered")
        loop = asyncio.get_running_loop()
        self._stopping, self._force = asyncio.Event(), asyncio.Event()
        stopping, force = self._stopping, self._force
        running = {
            asyncio.create_task(self._guarded(name, task, stopping), name=name): name
            for name, task in self._tasks.items()
        }
        installed: list[signal.Signals] = []
        if handle_signals:
            for sig in _STOP_SIGNALS:
                loop.add_signal_handler(sig, self.request_stop, f"signal {sig.name}")
                installed.append(sig)
        stop_waiter = asyncio.create_task(_until(stopping))
        force_waiter = asyncio.create_task(_until(force))
        failed = False
        pending = set(running)
        try:
            while pending and not stopping.is_set():
                done, _ = await asyncio.wait(pending | {stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
                for task in done - {stop_waiter}:
                    pending.discard(task)
                    # Ending in the same turn as a stop request is a normal stop, not a death.
                    expected = stopping.is_set()
                    failed |= self._note_end(running[task], task, expected=expected)
                    if not expected:
                        self.request_stop(f"root task {running[task]!r} ended")

            deadline = loop.time() + self._grace_seconds
            while pending and not force.is_set() and (remaining := deadline - loop.time()) > 0:
                done, _ = await asyncio.wait(
                    pending | {force_waiter}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done - {force_waiter}:
                    pending.discard(task)
                    failed |= self._note_end(running[task], task, expected=True)
            if pending:
                self._log.warning("cancelling root tasks", tasks=sorted(running[task] for task in pending))
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            for task in pending:
                task.cancel()
            for waiter in (stop_waiter, force_waiter):
                waiter.cancel()
            await asyncio.gather(*pending, stop_waiter, force_waiter, return_exceptions=True)
        for task in pending:
            # Cancelled after the grace period: that is the documented bound, not a failure. A task that
            # managed to fail while being cancelled still counts.
            failed |= self._note_end(running[task], task, expected=True)
        self._stopping = self._force = None
        return 1 if failed else 0
