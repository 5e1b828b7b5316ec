"""The signed deploy webhook, as a service: verify, validate, deduplicate, then hand the event to the
reconciler. The HTTP route (`warmer.api.deploy`) only maps `DeployResult` to a status code.

Order of checks, and why:
1. no secret configured -> DISABLED: an unsigned webhook would let anyone restart warm-ups;
2. signature over the RAW body and its timestamp (`warmer.core.webhook`) -> UNSIGNED / FORGED / STALE. A
   captured request replayed after the tolerance is STALE (401) whatever its id; nothing else is looked at,
   and nothing is written to the database for an unauthenticated request (it cannot grow the database);
3. payload shape (`warmer.config.webhook_payloads`, and the agent spec for a prompt change) -> MALFORMED
   (not JSON) / INVALID (field paths); `box.added` must pass the operator's URL allowlist here;
4. a database that does not answer at any later step -> UNAVAILABLE (503 with the reason, never a 500;
   the sender retries);
5. idempotency: the event id is remembered atomically in the store; a repeat (a retry, or a replay within
   the tolerance) is acknowledged as DUPLICATE and changes nothing;
6. checks against the live fleet (unknown box ids, unknown agent or model) -> INVALID. The id is consumed
   by then, so a corrected event needs a new id: checking before remembering would let a repeat of an
   applied `box.removed` fail as "unknown box" instead of being recognised as a repeat;
7. apply, and append the event to the event log.

Rollouts and fleet changes (`rollout.*`, `box.added` / `box.removed`) are shared state when the daemon has a
`CoordinationPort`: step 5 then remembers the id and writes the change in ONE transaction
(`apply_deploy`), after the fleet checks of step 6, and every replica (and this one after a restart)
applies it from the store (`warmer.core.shared_state`); the replica that received it also applies it at
once. The same event sent to another replica is a duplicate there and changes nothing. The fleet is the
config plus these changes, so a box added at runtime stays until removed; it is still only ever one whose
URL the allowlist admits.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from warmer.config.agents import agent_spec_from_data
from warmer.config.webhook_payloads import (
    AgentPromptChanged,
    BoxAdded,
    BoxRemoved,
    DeployEvent,
    RolloutFinished,
    RolloutStarted,
    parse_deploy_event,
    unknown_box_ids,
)
from warmer.core.agents import AgentSpec
from warmer.core.errors import ConfigError, StoreError, WarmerError
from warmer.core.event_kinds import EventKind
from warmer.core.model import BoxSpec, LoggedEvent
from warmer.core.shared_state import StateChange
from warmer.core.webhook import BoxUrlPolicy, InvalidEvent, SignatureOutcome, verify_signature
from warmer.ports import Clock, CoordinationPort, StorePort


class DeployOutcome(enum.StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"  # event id seen before: acknowledged, nothing changed
    DISABLED = "disabled"  # no webhook secret configured
    UNSIGNED = "unsigned"  # signature header missing or unparsable
    FORGED = "forged"  # no configured secret reproduces the signature
    STALE = "stale"  # valid signature, timestamp outside the tolerance (replay)
    MALFORMED = "malformed"  # body is not a JSON object
    INVALID = "invalid"  # fields wrong, or naming boxes/agents the daemon does not have
    UNAVAILABLE = "unavailable"  # the database did not answer: nothing changed, the sender retries


@dataclass(frozen=True, slots=True)
class DeployResult:
    outcome: DeployOutcome
    detail: str = ""
    event_id: str | None = None
    kind: str | None = None
    problems: tuple[tuple[str, str], ...] = ()  # (field path, message) for MALFORMED / INVALID


class FleetControl(Protocol):
    """What deploy events need from the reconciler (`warmer.service.reconciler.Reconciler`)."""

    def fleet(self) -> Mapping[str, BoxSpec]: ...

    def agent_specs(self) -> Mapping[str, AgentSpec]: ...

    def profile_names(self) -> frozenset[str]: ...

    def stage_prompt(self, spec: AgentSpec) -> None: ...

    def drain_boxes(self, box_ids: Sequence[str], reason: str) -> None: ...

    def undrain_boxes(self, box_ids: Sequence[str], epoch_tag: str) -> None: ...

    async def add_box(self, box: BoxSpec) -> None: ...

    async def remove_box(self, box_id: str) -> None: ...


class DeployHandler(Protocol):
    """What the HTTP route calls (tests may fake it)."""

    async def handle(self, body: bytes, signature: str | None) -> DeployResult: ...


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    secrets: tuple[str, ...]  # current first; empty disables the webhook
    tolerance_seconds: float = 300.0
    box_url_policy: BoxUrlPolicy = field(default_factory=BoxUrlPolicy)
    default_slots: int = 1  # slots of a `box.added` box that does not say


def _first_line(exc: Exception) -> str:
    """What failed, without the SQL statement and parameters a database error carries on later lines."""
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def rollout_drain_reason(event_id: str) -> str:
    return f"rollout in progress (event {event_id})"


def rollout_epoch_tag(event_id: str) -> str:
    """Short, stable tag that makes a box's epoch new after the rollout named by `event_id`."""
    return "rollout-" + hashlib.sha256(event_id.encode()).hexdigest()[:12]


class DeployService:
    """Handles one webhook delivery at a time (deliveries are rare; serialising keeps fleet checks and
    their application atomic with respect to each other)."""

    def __init__(
        self,
        *,
        store: StorePort,
        clock: Clock,
        config: WebhookConfig,
        fleet: FleetControl,
        on_fleet_change: Callable[[Sequence[BoxSpec]], None] | None = None,
        on_result: Callable[[DeployResult], None] | None = None,
        shared: CoordinationPort | None = None,
    ) -> None:
        self._store = store
        self._shared = shared
        self._clock = clock
        self._config = config
        self._fleet = fleet
        self._on_fleet_change = on_fleet_change
        self._on_result = on_result
        self._lock = asyncio.Lock()
        self._log = structlog.stdlib.get_logger(__name__)

    async def handle(self, body: bytes, signature: str | None) -> DeployResult:
        result = await self._handle(body, signature)
        level = "info" if result.outcome in (DeployOutcome.ACCEPTED, DeployOutcome.DUPLICATE) else "warning"
        getattr(self._log, level)(
            "deploy webhook",
            outcome=result.outcome.value,
            event_id=result.event_id,
            kind=result.kind,
            detail=result.detail,
        )
        if self._on_result is not None:
            self._on_result(result)
        return result

    async def _handle(self, body: bytes, signature: str | None) -> DeployResult:
        config = self._config
        if not config.secrets:
            return DeployResult(
                DeployOutcome.DISABLED, "deploy webhook disabled: api.webhook_secret is not configured"
            )
        check = verify_signature(
            body, signature, config.secrets, now=self._clock.now(), tolerance_seconds=config.tolerance_seconds
        )
        if check.outcome is SignatureOutcome.MALFORMED_HEADER:
            return DeployResult(DeployOutcome.UNSIGNED, f"signature header: {check.detail}")
        if check.outcome is SignatureOutcome.BAD_SIGNATURE:
            return DeployResult(DeployOutcome.FORGED, f"signature: {check.detail}")
        if check.outcome is SignatureOutcome.STALE:
            return DeployResult(DeployOutcome.STALE, f"signature: {check.detail}")
        try:
            event = parse_deploy_event(body, box_url_policy=config.box_url_policy)
        except InvalidEvent as exc:
            outcome = DeployOutcome.MALFORMED if exc.problems[0][0] == "(body)" else DeployOutcome.INVALID
            return DeployResult(outcome, str(exc), problems=tuple(exc.problems))
        spec: AgentSpec | None = None
        if isinstance(event, AgentPromptChanged):
            try:
                spec = self._agent_spec(event)
            except ConfigError as exc:
                return self._invalid(event, exc.problems)
        try:
            return await self._remember_and_apply(body, event, spec, self._fleet, self._store)
        except StoreError as exc:  # the database blinked: nothing may be half-done silently, so say retry
            return DeployResult(
                DeployOutcome.UNAVAILABLE, f"{_first_line(exc)}; retry later", event.id, event.kind
            )

    async def _remember_and_apply(
        self, body: bytes, event: DeployEvent, spec: AgentSpec | None, control: FleetControl, store: StorePort
    ) -> DeployResult:
        """Steps 5-7 under the lock: remember the id, check against the live fleet, apply, log."""
        async with self._lock:
            now = self._clock.now()
            digest = hashlib.sha256(body).hexdigest()
            shared, change = self._shared, self._state_change(event)
            problems = self._fleet_problems(event, spec, control)
            remembered = (
                await shared.apply_deploy(event.id, event.kind, digest, now, change)
                if shared is not None and change is not None and not problems
                else await store.remember_webhook(event.id, event.kind, digest, now)
            )
            if not remembered:
                return DeployResult(
                    DeployOutcome.DUPLICATE,
                    "event id already received; nothing changed",
                    event.id,
                    event.kind,
                )
            if not problems:
                try:
                    detail = await self._apply(event, spec, control, store, now, stored=change is not None)
                except StoreError:
                    raise  # the database, not the event: answered as unavailable
                except WarmerError as exc:  # the fleet changed between the checks and the act
                    problems = exc.problems if isinstance(exc, ConfigError) else [("(event)", str(exc))]
            if problems:
                await store.append_event(
                    LoggedEvent(
                        at=now,
                        kind=EventKind.DEPLOY_EVENT_REJECTED,
                        detail={"event_id": event.id, "event_kind": event.kind, "problems": problems},
                    )
                )
                return self._invalid(event, problems, consumed=True)
            await store.append_event(
                LoggedEvent(
                    at=now,
                    kind=EventKind.DEPLOY_EVENT,
                    agent_id=event.agent_id if isinstance(event, AgentPromptChanged) else None,
                    detail={
                        "event_id": event.id,
                        "event_kind": event.kind,
                        "occurred_at": event.occurred_at_unix,
                    }
                    | detail,
                )
            )
        return DeployResult(DeployOutcome.ACCEPTED, "", event.id, event.kind)

    @staticmethod
    def _invalid(
        event: DeployEvent, problems: Sequence[tuple[str, str]], *, consumed: bool = False
    ) -> DeployResult:
        text = "; ".join(f"{path}: {message}" for path, message in problems)
        if consumed:
            text += f" (event id {event.id!r} is now used: send the corrected event with a new id)"
        return DeployResult(DeployOutcome.INVALID, text, event.id, event.kind, tuple(problems))

    def _state_change(self, event: DeployEvent) -> StateChange | None:
        """What the event changes in the state replicas share; None for an event that changes none."""
        if isinstance(event, RolloutStarted):
            return StateChange(drain=dict.fromkeys(event.box_ids, rollout_drain_reason(event.id)))
        if isinstance(event, RolloutFinished):
            return StateChange(undrain=dict.fromkeys(event.box_ids, rollout_epoch_tag(event.id)))
        if isinstance(event, BoxAdded):
            return StateChange(add=event.box_spec(self._config.default_slots))
        if isinstance(event, BoxRemoved):
            return StateChange(remove=event.box_id)
        return None

    def _agent_spec(self, event: AgentPromptChanged) -> AgentSpec:
        """The event's spec as an AgentSpec; inline text only (an event never names files on this host)."""
        try:
            spec = agent_spec_from_data(
                event.spec, default_id=event.agent_id, base=None, source=f"deploy event {event.id}"
            )
        except ConfigError as exc:
            raise ConfigError(
                [(f"spec.{path}" if path else "spec", msg) for path, msg in exc.problems]
            ) from None
        if spec.id != event.agent_id:
            raise ConfigError([("spec.id", f"must equal agent_id {event.agent_id!r} (or be left out)")])
        return spec

    def _fleet_problems(
        self, event: DeployEvent, spec: AgentSpec | None, control: FleetControl
    ) -> list[tuple[str, str]]:
        boxes = control.fleet()
        problems = unknown_box_ids(event, boxes)
        if isinstance(event, AgentPromptChanged) and spec is not None:
            if event.agent_id not in control.agent_specs():
                problems.append(("agent_id", f"unknown agent {event.agent_id!r}"))
            if spec.model not in control.profile_names():
                problems.append(("spec.model", f"unknown model profile {spec.model!r}"))
        elif isinstance(event, BoxAdded):
            if event.box.model not in control.profile_names():
                problems.append(("box.model", f"unknown model profile {event.box.model!r}"))
            taken = {box.base_url.rstrip("/") for box in boxes.values()}
            if event.box.base_url.rstrip("/") in taken:
                problems.append(("box.base_url", "another registered box already has this URL"))
        return problems

    async def _apply(
        self,
        event: DeployEvent,
        spec: AgentSpec | None,
        control: FleetControl,
        store: StorePort,
        now: float,
        *,
        stored: bool = False,
    ) -> dict[str, object]:
        """Carry the event out; returns what the event log line should say about it.

        `stored`: the change is shared state this replica just wrote. Its own change listener may apply
        the stored change before this line runs (several replicas on PostgreSQL), so a fleet that already
        shows exactly this change is this event applied, not a conflict."""
        if isinstance(event, AgentPromptChanged):
            assert spec is not None
            control.stage_prompt(spec)
            return {"spec_hash": spec.spec_hash, "model": spec.model}
        if isinstance(event, RolloutStarted):
            control.drain_boxes(event.box_ids, rollout_drain_reason(event.id))
            for box_id in event.box_ids:
                await store.append_event(
                    LoggedEvent(
                        at=now, kind=EventKind.BOX_DRAINED, box_id=box_id, detail={"event_id": event.id}
                    )
                )
            return {"box_ids": list(event.box_ids)}
        if isinstance(event, RolloutFinished):
            tag = rollout_epoch_tag(event.id)
            control.undrain_boxes(event.box_ids, tag)
            for box_id in event.box_ids:
                await store.append_event(
                    LoggedEvent(
                        at=now,
                        kind=EventKind.BOX_UNDRAINED,
                        box_id=box_id,
                        detail={"event_id": event.id, "epoch_tag": tag},
                    )
                )
            return {"box_ids": list(event.box_ids), "epoch_tag": tag}
        if isinstance(event, BoxAdded):
            box = event.box_spec(self._config.default_slots)
            if stored and control.fleet().get(box.id) == box:
                return {"box_id": box.id, "base_url": box.base_url}
            before = list(control.fleet().values())
            self._fleet_changed([*before, box])  # the engine client may call it before the first poll
            try:
                await control.add_box(box)
            except WarmerError:
                self._fleet_changed(before)
                raise
            return {"box_id": box.id, "base_url": box.base_url}
        assert isinstance(event, BoxRemoved)
        removed = control.fleet().get(event.box_id)
        if removed is None and stored:
            return {"box_id": event.box_id}
        if removed is None:
            raise ConfigError([("box_id", f"unknown box {event.box_id!r}")])
        await control.remove_box(event.box_id)
        self._fleet_changed(list(control.fleet().values()))
        return {"box_id": event.box_id, "base_url": removed.base_url}

    def _fleet_changed(self, boxes: Sequence[BoxSpec]) -> None:
        if self._on_fleet_change is not None:
            self._on_fleet_change(boxes)
