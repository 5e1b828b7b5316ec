"""Deploy webhook payloads: one model per event kind, validated with field paths in every error.

They sit in `config` beside the settings they reuse (`BoxSettings` for `box.added`): validated pydantic
input, which the pure core (`warmer.core.webhook`: signatures and the URL rule) must not hold.

Every event carries `id` (idempotency key: a repeat is acknowledged and changes nothing) and
`occurred_at` (RFC 3339 or unix seconds). Kinds:

- `agent.prompt_changed`: `agent_id` + the agent's new prompt `spec` (the agent-spec loader validates
  the spec itself; here it only has to be a non-empty object).
- `rollout.started` / `rollout.finished`: `box_ids` about to restart / back on the new version.
- `box.added`: a `box` exactly as in the config file's `[[fleet.boxes]]`; its `base_url` must match
  the operator's allowlist (`BoxUrlPolicy`), so an event can never point the daemon at a URL the
  operator did not allow. Without a policy, `box.added` is always rejected.
- `box.removed`: `box_id`.

Whether box ids name registered boxes is checked against the live fleet with `unknown_box_ids`.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from warmer.config.fleet_settings import BoxSettings
from warmer.config.settings import validation_problems
from warmer.core.jsonbody import JsonBodyRejected, parse_json_body
from warmer.core.model import BoxSpec, CacheTier, EngineKind
from warmer.core.webhook import BoxUrlPolicy, InvalidEvent

BOX_URL_POLICY_CONTEXT = "box_url_policy"
_BOX_ID = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(
        min_length=1,
        max_length=200,
        description="Idempotency key chosen by the sender; a repeated id is acknowledged and ignored.",
    )
    occurred_at: datetime = Field(description="When it happened: RFC 3339 with a zone, or unix seconds.")

    @field_validator("occurred_at")
    @classmethod
    def _zoned(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            raise ValueError("must carry a time zone (e.g. 2025-01-31T12:00:00Z)")
        return value

    @property
    def occurred_at_unix(self) -> float:
        return self.occurred_at.timestamp()


class AgentPromptChanged(_Event):
    kind: Literal["agent.prompt_changed"]
    agent_id: str = Field(min_length=1, max_length=200, description="Agent whose prompt spec changed.")
    spec: dict[str, object] = Field(description="The agent's new prompt spec (same shape as its spec file).")

    @field_validator("spec")
    @classmethod
    def _not_empty(cls, value: dict[str, object]) -> dict[str, object]:
        if not value:
            raise ValueError("must not be empty")
        return value


class _RolloutEvent(_Event):
    box_ids: list[_BOX_ID] = Field(min_length=1, description="Boxes the rollout restarts.")

    @field_validator("box_ids")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        duplicates = sorted({box_id for box_id in value if value.count(box_id) > 1})
        if duplicates:
            raise ValueError(f"box ids repeat: {', '.join(duplicates)}")
        return value


class RolloutStarted(_RolloutEvent):
    """The boxes are about to restart on a new model/engine: take them out of the routes."""

    kind: Literal["rollout.started"]


class RolloutFinished(_RolloutEvent):
    """The boxes run the new version: restart warm-up, then back into the routes once ready."""

    kind: Literal["rollout.finished"]


class AllowedBox(BoxSettings):
    """A box from an event: the config file's box shape, and its base_url must pass the allowlist."""

    @field_validator("base_url")
    @classmethod
    def _allowed_url(cls, value: str, info: ValidationInfo) -> str:
        policy = (info.context or {}).get(BOX_URL_POLICY_CONTEXT)
        if not isinstance(policy, BoxUrlPolicy):
            policy = BoxUrlPolicy()  # no policy given: allow nothing
        problem = policy.check(value)
        if problem is not None:
            raise ValueError(f"not allowed: {problem}")
        return value

    @field_validator("kv_events")
    @classmethod
    def _no_event_sockets(cls, value: object) -> None:
        """The allowlist covers base URLs only: an event may not make the daemon connect anywhere else."""
        if value is not None:
            raise ValueError("not allowed in an event: kv_events is set in the config file only")
        return


class BoxAdded(_Event):
    kind: Literal["box.added"]
    box: AllowedBox = Field(description="The new box, as in the config file's [[fleet.boxes]].")

    def box_spec(self, default_slots: int = 1) -> BoxSpec:
        box = self.box
        return BoxSpec(
            id=box.id,
            base_url=box.base_url,
            engine=EngineKind(box.engine),
            model=box.model,
            slots=box.slots if box.slots is not None else default_slots,
            group=box.group,
            cache_capacity_tokens=box.cache_capacity_tokens,
            prefix_capacity=box.prefix_capacity,
            warm_tier=CacheTier(box.warm_tier),
            warm_priority=box.warm_priority,
        )


class BoxRemoved(_Event):
    kind: Literal["box.removed"]
    box_id: _BOX_ID = Field(description="Box to take out of the fleet.")


DeployEvent = Annotated[
    AgentPromptChanged | RolloutStarted | RolloutFinished | BoxAdded | BoxRemoved,
    Field(discriminator="kind"),
]
EVENT_KINDS = ("agent.prompt_changed", "rollout.started", "rollout.finished", "box.added", "box.removed")
_ADAPTER: TypeAdapter[DeployEvent] = TypeAdapter(DeployEvent)


def parse_deploy_event(body: bytes | str, *, box_url_policy: BoxUrlPolicy | None = None) -> DeployEvent:
    """Validate a raw webhook body; raises InvalidEvent listing (field path, message) problems."""
    try:
        data = parse_json_body(body.encode() if isinstance(body, str) else body)
    except JsonBodyRejected as exc:
        raise InvalidEvent([("(body)", exc.reason)]) from None
    if not isinstance(data, dict):
        raise InvalidEvent([("(body)", "must be a JSON object")])
    kind = data.get("kind")
    if kind not in EVENT_KINDS:
        raise InvalidEvent([("kind", f"must be one of {', '.join(EVENT_KINDS)}")])
    context = {BOX_URL_POLICY_CONTEXT: box_url_policy or BoxUrlPolicy()}
    try:
        return _ADAPTER.validate_python(data, context=context)
    except ValidationError as exc:
        # drop the discriminator tag pydantic puts first in each location (e.g. "box.added.box.model")
        problems = [
            (path.removeprefix(f"{kind}.") if path != kind else "(root)", message)
            for path, message in validation_problems(exc)
        ]
        raise InvalidEvent(problems) from None


def event_box_ids(event: DeployEvent) -> list[str]:
    """Box ids an event refers to that must already be registered (box.added brings its own)."""
    if isinstance(event, RolloutStarted | RolloutFinished):
        return list(event.box_ids)
    if isinstance(event, BoxRemoved):
        return [event.box_id]
    return []


def unknown_box_ids(event: DeployEvent, registered: Collection[str]) -> list[tuple[str, str]]:
    """Problems for box ids that name no registered box (the daemon only acts on its own fleet)."""
    problems = []
    if isinstance(event, RolloutStarted | RolloutFinished):
        for index, box_id in enumerate(event.box_ids):
            if box_id not in registered:
                problems.append((f"box_ids[{index}]", f"unknown box {box_id!r}"))
    elif isinstance(event, BoxRemoved) and event.box_id not in registered:
        problems.append(("box_id", f"unknown box {event.box_id!r}"))
    elif isinstance(event, BoxAdded) and event.box.id in registered:
        problems.append(("box.id", f"box {event.box.id!r} is already registered"))
    return problems
