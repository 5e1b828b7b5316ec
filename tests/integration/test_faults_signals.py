"""A `warmer serve` stopped by SIGKILL or SIGTERM in the middle of engine work, then started again on the same
config and database, over a real llama-server box that keeps running.

"Mid-warm": the prefix's warm of a freshly restarted engine is held in flight by the proxy when the signal
lands. "Mid-burst": the restart warm-up's concurrency bursts are held in flight. SIGTERM must still exit 0
within the shutdown grace; SIGKILL is a crash. Either way the successor: resolves what was left part way
at once (a `warming` row is abandoned and warmed again; an unfinished restart warm-up is run again for the
epoch), calls the box ready only once the engine itself reuses the whole prefix, and finds every event
row the first daemon wrote.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.integration.daemon_harness import FleetFactory, running_serve
from tests.integration.engine_proxy import Mode, burst_requests, prefix_requests
from tests.integration.fault_harness import FaultRig, assert_no_row_lost, event_rows, fault_rig

pytestmark = pytest.mark.integration

ABANDONED = "left warming by an earlier daemon"  # the planner's reason (warmer/core/planner.py)


def stop_mid_work(rig: FaultRig, sig: signal.Signals, what: str) -> str:
    """Restart the engine, hold `what` in flight, signal the daemon; returns the epoch being worked on."""
    (box_id,) = rig.box_ids
    proxy = rig.proxies[box_id]
    old_epoch = rig.serve.box(box_id)["epoch"]
    match = prefix_requests(rig.stable.token_ids or ()) if what == "warm" else burst_requests
    proxy.set_mode(Mode.HOLD, match=match)
    rig.fleet.restart(box_id)
    rig.serve.wait(f"a {what} in flight", lambda: proxy.holding() > 0, 180)
    epoch = rig.serve.box(box_id)["epoch"]
    assert epoch != old_epoch
    rig.serve.process.send_signal(sig)
    code = rig.serve.process.wait(timeout=60)
    assert code == (0 if sig is signal.SIGTERM else -signal.SIGKILL), rig.serve.log_tail()
    proxy.release()
    return str(epoch)


@pytest.mark.parametrize("what", ["warm", "burst"])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_a_daemon_stopped_mid_work_is_resumed_by_its_successor(
    llama_fleet_factory: FleetFactory, tmp_path: Path, sig: signal.Signals, what: str
) -> None:
    with fault_rig(llama_fleet_factory, tmp_path, log_name="serve-1.log") as rig:
        (box_id,) = rig.box_ids
        before = event_rows(rig.database_url)
        epoch = stop_mid_work(rig, sig, what)
        stopped = event_rows(rig.database_url)
        assert_no_row_lost(before, stopped)

        assert rig.config is not None
        with running_serve(rig.config, rig.port, tmp_path / "serve-2.log") as second:
            rig.serve = second
            rig.wait_all_ready()
            assert second.box(box_id)["epoch"] == epoch  # the engine kept running: same process
            rig.end_checks(stopped)
            second.stop()
        after = event_rows(rig.database_url)
    new = after[len(stopped) :]
    if what == "warm":
        # the first daemon's warming row: resolved by the successor at once, not after a timeout
        warming = [e for e in stopped if e["kind"] == "warm_transition" and e["epoch"] == epoch]
        assert warming, "the held warm was recorded as started"
        abandoned = [
            e for e in new if e["kind"] == "warm_transition" and e["detail"].get("reason") == ABANDONED
        ]
        assert [e["epoch"] for e in abandoned] == [epoch], new
    else:
        # the restart warm-up left part way is run again for the same epoch
        assert not [e for e in stopped if e["kind"] == "restart_warmup" and e["epoch"] == epoch]
        assert [e for e in new if e["kind"] == "restart_warmup" and e["epoch"] == epoch]
    assert [e for e in new if e["kind"] == "box_ready" and e["epoch"] == epoch]
