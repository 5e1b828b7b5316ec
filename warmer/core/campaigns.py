"""Dialer campaigns, pure: validating what the dialer sends, and the call volume a campaign adds.

One validator serves the HTTP API and the schedule file, so both reject the same things with the same
field names. Instants are ISO-8601 with an explicit offset (a naive time would silently mean the daemon's
zone) or unix seconds. Volume: a campaign's expected calls spread over its window give calls per minute,
which placement reads to size the agent's group (a busy campaign gets a wider group from its lead time on).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from warmer.core.errors import WarmerError
from warmer.core.model import Campaign

# Letters, digits and `._:-`, starting with a letter or digit: safe in a URL path, a log line and a key.
CAMPAIGN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
MAX_EXPECTED_CALLS = 10_000_000
# The last second a datetime (and so an ISO-8601 answer) can hold: 9999-12-31T23:59:59Z. Anything later is
# refused, never stored, so every stored campaign can be listed back.
MAX_INSTANT_SECONDS = 253_402_300_799.0
# A window shorter than a minute still counts as one minute of volume (no division blow-up).
MIN_VOLUME_WINDOW_SECONDS = 60.0


class CampaignInvalid(WarmerError):
    """A campaign field is wrong; `field` names it (as the dialer wrote it), `message` says why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class UnknownCampaignAgent(CampaignInvalid):
    """The campaign names an agent this daemon does not define."""

    def __init__(self, agent_id: str) -> None:
        super().__init__("agent", f"unknown agent {agent_id!r}")
        self.agent_id = agent_id


def check_campaign_id(value: object) -> str:
    if not isinstance(value, str) or CAMPAIGN_ID_PATTERN.fullmatch(value) is None:
        raise CampaignInvalid(
            "id", "1-128 characters of letters, digits and `._:-`, starting with a letter or digit"
        )
    return value


def parse_instant(value: object, field: str) -> float:
    """Unix seconds from a number (unix seconds) or an ISO-8601 string with an offset (`Z`, `+02:00`)."""
    if isinstance(value, bool):
        raise CampaignInvalid(field, "expected an ISO-8601 time or unix seconds, got a boolean")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # an int too big for a float
            seconds = math.inf
    elif isinstance(value, datetime):  # a TOML schedule file's native datetime
        if value.tzinfo is None or value.utcoffset() is None:
            raise CampaignInvalid(field, "time needs an offset, e.g. `Z` or `+00:00`")
        seconds = value.timestamp()
    elif isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            seconds = _iso_seconds(text, field)
    else:
        raise CampaignInvalid(field, f"expected an ISO-8601 time or unix seconds, got {type(value).__name__}")
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_INSTANT_SECONDS:
        raise CampaignInvalid(field, "must be a time from 1970-01-01 to 9999-12-31 (UTC)")
    return seconds


def _iso_seconds(text: str, field: str) -> float:
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise CampaignInvalid(field, f"not an ISO-8601 time or unix seconds: {text!r}") from None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise CampaignInvalid(field, "ISO-8601 time needs an offset, e.g. `Z` or `+00:00`")
    return parsed.timestamp()


def check_expected_calls(value: object, field: str = "expected_calls") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CampaignInvalid(field, "expected a whole number of calls")
    if not 0 <= value <= MAX_EXPECTED_CALLS:
        raise CampaignInvalid(field, f"must be between 0 and {MAX_EXPECTED_CALLS}")
    return value


@dataclass(frozen=True, slots=True)
class CampaignDraft:
    """A campaign as received (API body or schedule-file entry), not yet checked."""

    id: object
    agent: object
    starts_at: object
    ends_at: object
    expected_calls: object = 0


def build_campaign(draft: CampaignDraft, known_agents: Collection[str] | None = None) -> Campaign:
    """Check every field (first problem raised, naming its field) and return the core value.

    `known_agents` None skips the agent check (the store accepts bookings before the agent exists)."""
    campaign_id = check_campaign_id(draft.id)
    if not isinstance(draft.agent, str) or not draft.agent:
        raise CampaignInvalid("agent", "required: the agent id the campaign dials for")
    if known_agents is not None and draft.agent not in known_agents:
        raise UnknownCampaignAgent(draft.agent)
    starts_at = parse_instant(draft.starts_at, "starts_at")
    ends_at = parse_instant(draft.ends_at, "ends_at")
    if ends_at <= starts_at:
        raise CampaignInvalid("ends_at", "must be after starts_at")
    return Campaign(
        id=campaign_id,
        agent_id=draft.agent,
        starts_at=starts_at,
        ends_at=ends_at,
        expected_calls=check_expected_calls(draft.expected_calls),
    )


def calls_per_minute(campaign: Campaign) -> float:
    """The campaign's expected calls spread evenly over its window."""
    window = max(MIN_VOLUME_WINDOW_SECONDS, campaign.ends_at - campaign.starts_at)
    return campaign.expected_calls * 60.0 / window


def campaign_demand(campaigns: Iterable[Campaign], now: float, lead_seconds: float) -> dict[str, float]:
    """Agent -> calls per minute of its campaigns active now (from `lead_seconds` before the window on),
    summed: two overlapping campaigns for one agent need the room of both."""
    demand: dict[str, float] = {}
    for campaign in campaigns:
        if campaign.starts_at - lead_seconds <= now < campaign.ends_at:
            demand[campaign.agent_id] = demand.get(campaign.agent_id, 0.0) + calls_per_minute(campaign)
    return demand


def merge_demand(*sources: Mapping[str, float]) -> dict[str, float]:
    """The busiest figure per agent across sources (campaign plan vs observed pre-call asks)."""
    merged: dict[str, float] = {}
    for source in sources:
        for agent_id, cpm in source.items():
            merged[agent_id] = max(merged.get(agent_id, 0.0), cpm)
    return merged


def campaign_json(campaign: Campaign) -> dict[str, object]:
    """The wire/file form: times as unix seconds and as ISO-8601 UTC, so both kinds of client read it.

    Total over whatever a row holds: a value JSON or a datetime cannot carry (a row written before the
    range checks, or by hand) comes out as null, so one bad row never breaks the listing of all of them."""
    return {
        "id": campaign.id,
        "agent": campaign.agent_id,
        "starts_at": _finite(campaign.starts_at),
        "ends_at": _finite(campaign.ends_at),
        "starts_at_iso": _iso(campaign.starts_at),
        "ends_at_iso": _iso(campaign.ends_at),
        "expected_calls": campaign.expected_calls,
        "calls_per_minute": _finite(round(calls_per_minute(campaign), 3)),
    }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _iso(seconds: float) -> str | None:
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_INSTANT_SECONDS:
        return None
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat().replace("+00:00", "Z")
