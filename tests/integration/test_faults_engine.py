"""Engines that misbehave while warmer must warm them: a real `warmer serve`, a real llama-server box behind
a proxy (tests/integration/engine_proxy.py) that refuses connections, hangs, answers 500, answers garbage or
cuts its answer short, and an engine restarted in the middle of a warm.

Each case restarts the engine (a new process: cold, a new epoch) while the proxy misbehaves on the prefix's
warm and probe requests (the restart warm-up and health checks pass), so warmer has real work it cannot do.
Throughout: the daemon stays alive and never calls the cold box ready. Once the proxy behaves, the box is
warmed and ready again, a real first turn to the engine itself reuses the whole prefix, and no event row
written before the fault is lost or changed.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.daemon_harness import FleetFactory
from tests.integration.engine_proxy import Mode, prefix_requests
from tests.integration.fault_harness import event_rows, fault_rig

pytestmark = pytest.mark.integration

FAULTED_REQUESTS = 2  # the fault is held until warmer has met it this often (a warm and a retry)
CASES = [Mode.REFUSE, Mode.HANG, Mode.ERROR, Mode.GARBAGE, Mode.TRUNCATED]


def test_a_misbehaving_engine_is_never_ready_and_recovers(
    llama_fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    with fault_rig(llama_fleet_factory, tmp_path) as rig:
        (box_id,) = rig.box_ids
        proxy = rig.proxies[box_id]
        for mode in CASES:
            before = event_rows(rig.database_url)
            old_epoch = rig.serve.box(box_id)["epoch"]
            if mode is Mode.REFUSE:
                proxy.set_mode(mode)  # nothing listens: health fails too
            else:
                proxy.set_mode(mode, match=prefix_requests(rig.stable.token_ids or ()))
            rig.fleet.restart(box_id)
            rig.serve.wait(
                f"{mode}: the restarted box out of readiness", lambda: not rig.serve.is_ready(box_id), 60
            )
            if mode is Mode.REFUSE:
                rig.hold_not_ready(box_id, lambda: True, "refused", min_seconds=5.0)
            else:
                rig.hold_not_ready(
                    box_id,
                    lambda: sum(1 for s in proxy.seen() if s.mode is mode) >= FAULTED_REQUESTS,  # noqa: B023
                    f"{FAULTED_REQUESTS} warm requests answered as {mode}",
                )

            proxy.set_mode(Mode.PASS)
            rig.serve.wait(f"{mode}: the box ready again", lambda: rig.serve.is_ready(box_id))
            assert rig.serve.box(box_id)["epoch"] != old_epoch, mode
            assert rig.assert_ready_boxes_are_warm() == [box_id], mode
            rig.end_checks(before)


def test_an_engine_restarted_mid_warm_is_warmed_in_its_new_process(
    llama_fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    with fault_rig(llama_fleet_factory, tmp_path) as rig:
        (box_id,) = rig.box_ids
        proxy = rig.proxies[box_id]
        before = event_rows(rig.database_url)
        first_epoch = rig.serve.box(box_id)["epoch"]
        proxy.set_mode(Mode.HOLD, match=prefix_requests(rig.stable.token_ids or ()))
        rig.fleet.restart(box_id)
        rig.serve.wait("a warm of the new process in flight", lambda: proxy.holding() > 0, 120)
        held_epoch = rig.serve.box(box_id)["epoch"]
        assert held_epoch != first_epoch
        rig.fleet.restart(box_id)  # mid-warm: the process being warmed goes away
        rig.serve.wait(
            "the daemon sees the next process", lambda: rig.serve.box(box_id)["epoch"] != held_epoch, 60
        )
        rig.hold_not_ready(box_id, lambda: True, "the held warm", min_seconds=2.0)
        proxy.release()  # the held warm now lands on the newer process: its result must not count
        rig.serve.wait("the box ready in its newest process", lambda: rig.serve.is_ready(box_id))
        assert rig.serve.box(box_id)["epoch"] not in (first_epoch, held_epoch)
        rig.end_checks(before)


def test_a_hung_engine_keeps_its_routes_for_one_late_health_answer_then_leaves(
    llama_fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    """A real llama-server whose /health stops answering (the proxy takes the connection and holds it, as a
    saturated or wedged process does): the first late answer keeps the ready box in its routes
    (`reconcile.health_slow_polls_allowed` = 1), the second in a row takes it out; answering again, the same
    process is ready again — no restart was seen, so its epoch is unchanged."""
    with fault_rig(llama_fleet_factory, tmp_path) as rig:
        (box_id,) = rig.box_ids
        proxy = rig.proxies[box_id]
        epoch = rig.serve.box(box_id)["epoch"]
        proxy.set_mode(Mode.HANG, paths={"/health"})
        logged = rig.serve.log.read_text
        rig.serve.wait("one late health answer logged", lambda: "box slow to answer" in logged(), 30)
        assert rig.serve.is_ready(box_id)  # the next late answer is a poll interval and a timeout away
        rig.serve.wait("the box out of readiness", lambda: not rig.serve.is_ready(box_id), 30)
        assert "box unhealthy: out of every route" in logged()
        proxy.set_mode(Mode.PASS, paths={"/health"})
        rig.serve.wait("the box ready again", lambda: rig.serve.is_ready(box_id))
        assert rig.serve.box(box_id)["epoch"] == epoch
        assert rig.assert_ready_boxes_are_warm() == [box_id]


def test_an_engine_that_claims_every_prompt_cached_is_never_ready_and_recovers(
    llama_fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    """A consistent liar in front of a real llama-server: nothing is reused (`cache_prompt` off), every
    answer claims the whole prompt but its last token cached, its counts agreeing with each other. Before
    this was caught, its warms read as verified and the restarted, cold box answered ready."""
    with fault_rig(llama_fleet_factory, tmp_path) as rig:
        (box_id,) = rig.box_ids
        proxy = rig.proxies[box_id]
        before = event_rows(rig.database_url)
        old_epoch = rig.serve.box(box_id)["epoch"]
        proxy.set_mode(Mode.LIE)
        mark = len(proxy.seen())
        rig.fleet.restart(box_id)
        rig.serve.wait("the restarted box out of readiness", lambda: not rig.serve.is_ready(box_id), 60)
        rig.hold_not_ready(
            box_id,
            lambda: "made up this moment" in str(rig.serve.box(box_id).get("warmup_error")),
            "the restart warm-up failed on the lie",
        )
        since_restart = proxy.seen()[mark:]
        assert not any(s.is_prefix_warm(rig.stable.token_ids or ()) for s in since_restart)  # nothing warmed
        proxy.set_mode(Mode.PASS)
        rig.serve.wait("the box ready again", lambda: rig.serve.is_ready(box_id), 180)
        assert rig.serve.box(box_id)["epoch"] != old_epoch
        assert rig.assert_ready_boxes_are_warm() == [box_id]
        rig.end_checks(before)


def test_a_restarted_box_is_never_called_ready_before_its_prefix_is_warm_again(
    llama_fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    """`/v1/boxes/{id}/ready` sampled every 0.1 s through real restarts: the first 200 after each one must
    come with the prefix in the engine's cache. Before the fix, a box whose restart warm-up finished before
    placement looked at it again answered 200 with nothing assigned yet (1 of 3,113 tokens cached), in 2
    of 4 trials."""
    with fault_rig(llama_fleet_factory, tmp_path) as rig:
        (box_id,) = rig.box_ids
        for trial in range(4):
            old_epoch = rig.serve.box(box_id)["epoch"]
            rig.fleet.restart(box_id)
            rig.serve.wait(
                f"trial {trial}: the new process seen",
                lambda: rig.serve.box(box_id)["epoch"] != old_epoch,  # noqa: B023
                60,
            )
            deadline = time.monotonic() + 120.0
            while not rig.serve.is_ready(box_id):
                assert time.monotonic() < deadline, (
                    f"trial {trial}: never ready again\n{rig.serve.log_tail()}"
                )
                time.sleep(0.1)
            cached = rig.engine_cached_tokens(
                box_id
            )  # at the first 200: a real first turn, the engine's count
            assert cached >= rig.stable.token_count - 1, (
                f"trial {trial}: ready with {cached} of {rig.stable.token_count} prefix tokens cached"
            )
