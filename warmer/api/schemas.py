"""The documented shapes of every answer the API gives, so the served OpenAPI schema says what clients get
(and schemathesis checks each answer against it: tests/unit/test_api_schema.py).

Routes build their JSON by hand (a thin shell over the services' own values); these models only describe
it. Box and route views are the status service's dataclasses themselves, so they cannot drift apart.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from warmer.core.capacity import AgentCapacity, BoxCapacity
from warmer.service.views.status import AgentRoutes, BoxView


class Health(BaseModel):
    status: Literal["ok"]


class Stalled(BaseModel):
    status: Literal["stalled"]
    reason: str


class Ready(BaseModel):
    status: Literal["ready"]


class NotReady(BaseModel):
    status: Literal["not ready"]
    reason: str


class Detail(BaseModel):
    """FastAPI's own error body (bearer-token refusals, unknown boxes, status unavailable)."""

    detail: str


class Unavailable(BaseModel):
    """503: the service cannot answer now; `reason` says why (e.g. the database does not answer)."""

    error: Literal["unavailable"]
    reason: str
    agent: str | None = Field(default=None, description="The agent asked for (pre-call only).")


class Problem(BaseModel):
    """400 / 404 / 422: what is wrong and where (`field` is `body` when the body itself is unreadable)."""

    error: str = Field(description="malformed | invalid | unknown_agent | not_found")
    field: str | None = None
    detail: str | None = None
    agent: str | None = None
    reason: str | None = None


class TooLarge(BaseModel):
    error: Literal["too_large"]
    detail: str


class BoxList(BaseModel):
    boxes: list[BoxView]


class BoxReadiness(BaseModel):
    box: str
    ready: bool
    reasons: list[str]
    since: float | None = None
    weight: float | None = None


class BoxAdmission(BaseModel):
    box: str
    admit: bool = Field(description="What a readiness probe acts on: true = let traffic in.")
    ready: bool = Field(description="The truth, as /v1/boxes/{id}/ready answers it.")
    reason: str = Field(description="Why admitted or held.")
    release: str | None = Field(
        default=None,
        description="Let in while not ready, by this rule: latched, held_too_long or share ([gate]).",
    )
    reasons: list[str] = Field(default_factory=list, description="Why not ready (empty when ready).")


class RouteTable(BaseModel):
    routes: dict[str, AgentRoutes] = Field(description="Agent id -> its routes.")


class PrewarmAnswerBody(BaseModel):
    agent: str
    box_id: str
    base_url: str
    prefix_hash: str | None
    state: str = Field(description="The agent's prefix state on that box (a warm-record state).")
    ready: bool
    waited_ms: int
    detail: str
    slot: int | None = Field(
        default=None,
        description=(
            "llama.cpp: the slot holding the prefix (ready), or reserved for its warm in flight (warming: a "
            "call sent there with id_slot queues behind the warm and finds the prefix)."
        ),
    )


class StoredCampaign(BaseModel):
    """A stored campaign. Times are null only for a stored value JSON or ISO-8601 cannot carry."""

    id: str
    agent: str
    starts_at: float | None
    ends_at: float | None
    starts_at_iso: str | None
    ends_at_iso: str | None
    expected_calls: int
    calls_per_minute: float | None


class CampaignList(BaseModel):
    campaigns: list[StoredCampaign]


class Shortfall(BaseModel):
    agents_wanted: int
    agents_kept: int = Field(
        description="Agents with at least one box keeping their prefix warm (loans count)."
    )
    agents_without_room: list[str] = Field(
        description="Agents the caches cannot hold now: their calls start cold unless room is lent to them."
    )
    tokens_without_room: int = Field(description="Prefix tokens those agents need, one copy each.")


class CapacityTable(BaseModel):
    safe_fraction: float
    unit: str
    agents: dict[str, AgentCapacity] = Field(description="Agent id -> its group's prefill budget.")
    boxes: dict[str, BoxCapacity] = Field(description="Box id -> its prefill budget.")
    shortfall: Shortfall | None = Field(
        description="Demand the caches cannot hold (null before the first pass)."
    )


class FieldProblem(BaseModel):
    field: str
    message: str


class DeployAnswer(BaseModel):
    outcome: str = Field(
        description="accepted | duplicate | disabled | unsigned | forged | stale | malformed | invalid | "
        "unavailable | too_large"
    )
    event_id: str | None = None
    kind: str | None = None
    accepted: bool | None = None
    duplicate: bool | None = None
    detail: str | None = None
    problems: list[FieldProblem] | None = None


def inline_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A pydantic JSON schema with its `$defs` written in place, for a request body given as
    `openapi_extra` (where `#/$defs/...` would point nowhere in the OpenAPI document). A discriminator's
    mapping names those refs too, so it is dropped: each variant's `const` tag still tells them apart."""
    definitions = schema.get("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            reference = node.get("$ref")
            if isinstance(reference, str) and reference.startswith("#/$defs/"):
                extra = {key: value for key, value in node.items() if key != "$ref"}
                return resolve({**definitions[reference.removeprefix("#/$defs/")], **extra})
            return {
                key: resolve(value) for key, value in node.items() if key not in ("$defs", "discriminator")
            }
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    resolved: dict[str, Any] = resolve(schema)
    return resolved


def described(model: type[Any], description: str) -> dict[str, Any]:
    """One `responses` entry of a route: the model and what the status means."""
    return {"model": model, "description": description}


def unavailable(reason: str, **extra: str) -> JSONResponse:
    """The 503 body every route uses (the store's exception handler too: warmer/api/storeerrors.py)."""
    return JSONResponse({"error": "unavailable", "reason": reason, **extra}, 503)


UNAUTHORIZED: dict[int | str, dict[str, Any]] = {401: described(Detail, "Missing or invalid bearer token")}
UNAVAILABLE: dict[int | str, dict[str, Any]] = {
    503: described(
        Unavailable, "Cannot answer now (the database does not answer, or the service is not configured)"
    )
}
