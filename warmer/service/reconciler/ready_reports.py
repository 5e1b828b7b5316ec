"""Readiness bookkeeping: the moment each box's epoch became ready, and what that took.

What makes a box ready is decided by the pure core (`box_ready`); this records, once per epoch, when
that first held: a `box_ready` event with the time from health up to ready next to the engine time it
took, the PREFIXES phase closed, and the time-to-ready metric (a daemon restarted over a running engine
records only its re-verification time: it did not see the epoch start). After every pass it also
reports the fleet's readiness and warmth to the metrics, and says loudly (a warning, a `gate_released`
event, the metric) when the admission gate (`warmer.core.gate`) lets in a box that is not ready.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import structlog

from warmer.core.event_kinds import EventKind
from warmer.core.gate import GateAnswer, GateBox, GateConfig, gate
from warmer.core.model import BoxSpec, LoggedEvent, PhaseName, PhaseRecord
from warmer.core.planner import Desired, Observed, PlannerConfig
from warmer.core.readiness import agent_warmth, boxes_ready
from warmer.core.warmstate import is_serving
from warmer.ports import Clock, StorePort
from warmer.service.reconciler.types import BoxLive, ReadyReport, ReconcileObserver


def ready_detail(report: ReadyReport) -> dict[str, object]:
    """The box_ready event's detail. A resumed report carries only its re-verification time: its engine
    figures cover just this daemon's probes, so an overhead computed from them would be meaningless."""
    if report.resumed:
        return {"resumed": True, "reverify_seconds": round(report.reverify_seconds, 6)}
    return {
        "time_to_ready_seconds": round(report.time_to_ready_seconds, 6),
        "engine_seconds": round(report.engine_seconds, 6),
        "warmup_engine_seconds": round(report.warmup_engine_seconds, 6),
        "prefix_engine_seconds": round(report.prefix_engine_seconds, 6),
        "overhead_fraction": round(report.overhead_fraction, 4),
    }


def gate_answers(
    boxes: Mapping[str, BoxSpec],
    live: Mapping[str, BoxLive],
    ready: Mapping[str, bool],
    now: float,
    config: GateConfig,
) -> dict[str, GateAnswer]:
    """The admission gate over the fleet as the reconciler sees it: one rule for the pass and the API."""
    seen = []
    for box_id, box in boxes.items():
        state = live.get(box_id)
        if state is None:
            continue
        up = state.healthy and state.epoch is not None
        report = state.ready_report
        seen.append(
            GateBox(
                box_id=box_id,
                model=box.model,
                group=box.group,
                healthy_since=(state.healthy_since if state.healthy_since is not None else now)
                if up
                else None,
                ready=ready.get(box_id, False),
                # ready in this epoch, or serving before this daemon started (an earlier one warmed it up):
                # a warmer restart must not pull serving engines out of their Services
                was_ready=state.resumed or (report is not None and report.epoch == state.epoch),
            )
        )
    return gate(seen, now, config)


class ReadyReports:
    """Writes each epoch's ready report once; remembers which boxes were ready under this daemon."""

    def __init__(
        self,
        *,
        store: StorePort,
        clock: Clock,
        config: PlannerConfig,
        observer: ReconcileObserver,
        log: structlog.stdlib.BoundLogger,
        owns: Callable[[str], bool] = lambda _box_id: True,
        gate: GateConfig | None = None,
    ) -> None:
        self._gate = gate or GateConfig()
        # the last pass's gate answer per box, with the epoch it was given for (replaced, never mutated)
        self.gate: Mapping[str, tuple[str | None, GateAnswer]] = {}
        self._owns = owns  # a box held by another replica: its holder records the ready moment
        self._store = store
        self._clock = clock
        self._config = config
        self._observer = observer
        self._log = log
        self._served: set[str] = set()  # boxes that were ready at least once under this daemon
        # this pass's rows, written together at its end (a region coming back is many boxes in one pass)
        self._phases: list[PhaseRecord] = []
        self._events: list[LoggedEvent] = []

    def served(self, box_id: str) -> bool:
        return box_id in self._served

    async def note(self, live: Mapping[str, BoxLive], desired: Desired, observed: Observed) -> None:
        """Record, once per epoch (per daemon: a resumed epoch is recorded as such), the moment a box
        became ready and what that took; then report the fleet's state."""
        now = self._clock.now()
        answers = boxes_ready(live, desired, observed, now, self._config)
        await asyncio.sleep(0)  # a turn of the loop for the asks between readiness and its reports
        ready_by_box = {box_id: answer.ready for box_id, answer in answers.items()}
        for box_id, box in live.items():
            if ready_by_box[box_id] and box.ready_report is None and box.epoch is not None:
                self._record(box_id, box, box.epoch, now)
        warm = sum(1 for r in observed.warm.values() if is_serving(r))
        self._observer.fleet_state(sum(ready_by_box.values()), warm)
        self._observer.box_states(ready_by_box, agent_warmth(desired, observed))
        self._note_gate(desired.boxes, live, ready_by_box, now)
        phases, events, self._phases, self._events = self._phases, self._events, [], []
        refused = await self._store.put_phases_and_events(phases, events)  # one transaction
        for box_id in sorted(refused):
            self._log.warning("box phase not written: lease held elsewhere", box=box_id)

    def _note_gate(
        self, boxes: Mapping[str, BoxSpec], live: Mapping[str, BoxLive], ready: Mapping[str, bool], now: float
    ) -> None:
        """A box the gate lets in while it is not ready is a fleet in trouble (it could not warm in time, or
        every box of a model restarted at once): a warning and an event once per release, and the metric."""
        answers = gate_answers(boxes, live, ready, now, self._gate)
        before, self.gate = self.gate, {box_id: (live[box_id].epoch, a) for box_id, a in answers.items()}
        for box_id, given in self.gate.items():
            epoch, answer = given
            if answer.release is None or before.get(box_id) == given:
                continue  # held or ready, or let in already on the last pass for the same reason
            self._log.warning(
                "box let in by the readiness gate while not ready", box=box_id, why=answer.reason
            )
            if self._owns(box_id):
                self._events.append(
                    LoggedEvent(
                        at=now,
                        kind=EventKind.GATE_RELEASED,
                        box_id=box_id,
                        epoch=epoch,
                        detail={"release": answer.release, "reason": answer.reason},
                    )
                )
        self._observer.gate_released(
            {box_id: a.release for box_id, (_, a) in self.gate.items() if a.release is not None}
        )

    def _record(self, box_id: str, live: BoxLive, epoch: str, now: float) -> None:
        since_mono = (
            live.healthy_since_mono if live.healthy_since_mono is not None else self._clock.monotonic()
        )
        report = ReadyReport(
            box_id=box_id,
            epoch=epoch,
            at=now,
            time_to_ready_seconds=max(0.0, self._clock.monotonic() - since_mono),
            warmup_engine_seconds=live.warmup_engine_seconds,
            prefix_engine_seconds=live.prefix_engine_seconds,
            warmup_wall_seconds=live.warmup_wall_seconds,
            resumed=live.resumed,
        )
        live.ready_report = report
        self._served.add(box_id)
        if not self._owns(box_id):
            return
        if live.prefixes_started_at is not None:  # None: an earlier daemon finished this epoch's phase
            self._phases.append(
                PhaseRecord(
                    box_id=box_id,
                    epoch=epoch,
                    phase=PhaseName.PREFIXES,
                    started_at=live.prefixes_started_at,
                    finished_at=now,
                    engine_seconds=live.prefix_engine_seconds,
                    requests=live.prefix_requests,
                    ok=True,
                )
            )
        self._events.append(
            LoggedEvent(
                at=now, kind=EventKind.BOX_READY, box_id=box_id, epoch=epoch, detail=ready_detail(report)
            )
        )
        if report.resumed:
            # Not a time to ready: this daemon did not see the epoch start. Observing it would put a
            # restart-of-the-daemon figure (~0 engine seconds) into the time-to-ready statistics.
            self._log.info(
                "box ready (resumed)",
                box=box_id,
                epoch=epoch,
                reverify_seconds=round(report.reverify_seconds, 3),
            )
            return
        self._observer.box_ready(box_id, report.time_to_ready_seconds, report.engine_seconds)
        self._log.info(
            "box ready",
            box=box_id,
            epoch=epoch,
            time_to_ready_seconds=round(report.time_to_ready_seconds, 3),
            engine_seconds=round(report.engine_seconds, 3),
            overhead=f"{report.overhead_fraction:.1%}",
        )
