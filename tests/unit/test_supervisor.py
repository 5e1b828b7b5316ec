"""Supervisor: a dying root task stops the rest with exit 1; a requested stop is graceful, then bounded."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest

from warmer.root.supervisor import Supervisor


async def until_stopped(stopping: asyncio.Event) -> None:
    await stopping.wait()


def test_requested_stop_lets_tasks_finish_and_exits_zero() -> None:
    finished: list[str] = []

    async def polite(stopping: asyncio.Event) -> None:
        await stopping.wait()
        await asyncio.sleep(0.01)  # some cleanup work
        finished.append("polite")

    async def scenario() -> int:
        supervisor = Supervisor(grace_seconds=30)
        supervisor.add("polite", polite)
        supervisor.add("other", until_stopped)
        running = asyncio.create_task(supervisor.run(handle_signals=False))
        await asyncio.sleep(0.05)
        supervisor.request_stop("test")
        code = await running
        assert supervisor.stop_reason == "test"
        return code

    assert asyncio.run(scenario()) == 0
    assert finished == ["polite"]


def test_a_failing_task_stops_the_others_and_exits_nonzero() -> None:
    failures: list[str] = []
    stopped: list[str] = []

    async def broken(stopping: asyncio.Event) -> None:
        await asyncio.sleep(0.01)
        raise RuntimeError("database went away")

    async def survivor(stopping: asyncio.Event) -> None:
        await stopping.wait()
        stopped.append("survivor")

    async def scenario() -> int:
        supervisor = Supervisor(grace_seconds=30, on_task_failure=failures.append)
        supervisor.add("broken", broken)
        supervisor.add("survivor", survivor)
        code = await supervisor.run(handle_signals=False)
        assert supervisor.stop_reason == "root task 'broken' ended"
        return code

    assert asyncio.run(scenario()) == 1
    assert failures == ["broken"]
    assert stopped == ["survivor"]


def test_a_task_returning_early_is_fatal() -> None:
    async def quitter(stopping: asyncio.Event) -> None:
        return

    supervisor = Supervisor(grace_seconds=1)
    supervisor.add("quitter", quitter)
    supervisor.add("other", until_stopped)
    assert asyncio.run(supervisor.run(handle_signals=False)) == 1


def test_sys_exit_in_a_task_is_contained_and_fatal() -> None:
    async def exits(stopping: asyncio.Event) -> None:
        sys.exit(3)

    failures: list[str] = []
    supervisor = Supervisor(grace_seconds=1, on_task_failure=failures.append)
    supervisor.add("exits", exits)
    supervisor.add("other", until_stopped)
    assert asyncio.run(supervisor.run(handle_signals=False)) == 1
    assert failures == ["exits"]


def test_a_task_ignoring_the_stop_is_cancelled_after_the_grace() -> None:
    cancelled: list[str] = []

    async def stubborn(stopping: asyncio.Event) -> None:
        try:
            await asyncio.Event().wait()  # never looks at `stopping`
        except asyncio.CancelledError:
            cancelled.append("stubborn")
            raise

    async def scenario() -> int:
        supervisor = Supervisor(grace_seconds=0.05)
        supervisor.add("stubborn", stubborn)
        running = asyncio.create_task(supervisor.run(handle_signals=False))
        await asyncio.sleep(0.01)
        supervisor.request_stop("test")
        return await running

    assert asyncio.run(scenario()) == 0
    assert cancelled == ["stubborn"]


def test_a_second_stop_request_cancels_without_waiting() -> None:
    cancelled: list[str] = []

    async def stubborn(stopping: asyncio.Event) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append("stubborn")
            raise

    async def scenario() -> int:
        supervisor = Supervisor(grace_seconds=3600)  # would hang the test if the second request did nothing
        supervisor.add("stubborn", stubborn)
        running = asyncio.create_task(supervisor.run(handle_signals=False))
        await asyncio.sleep(0.01)
        supervisor.request_stop("first")
        await asyncio.sleep(0.01)
        supervisor.request_stop("second")
        return await asyncio.wait_for(running, 60)

    assert asyncio.run(scenario()) == 0
    assert cancelled == ["stubborn"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_stop_gracefully(sig: signal.Signals) -> None:
    async def scenario() -> int:
        supervisor = Supervisor(grace_seconds=30)
        supervisor.add("waits", until_stopped)
        running = asyncio.create_task(supervisor.run())
        await asyncio.sleep(0.05)
        os.kill(os.getpid(), sig)
        code = await running
        assert supervisor.stop_reason == f"signal {sig.name}"
        return code

    assert asyncio.run(scenario()) == 0


def test_names_are_unique_and_something_must_run() -> None:
    supervisor = Supervisor(grace_seconds=1)
    supervisor.add("a", until_stopped)
    with pytest.raises(ValueError, match="already registered"):
        supervisor.add("a", until_stopped)
    with pytest.raises(ValueError, match="no root tasks"):
        asyncio.run(Supervisor(grace_seconds=1).run(handle_signals=False))
