"""The dialer schedule: campaigns put, deleted and listed through the store, and a schedule file synced in.

Campaigns live in the store, never only in memory: the reconciler reads them back every tick (its
`Desired.campaigns`), so a campaign booked before a daemon restart still gets its agent warm on time. A
change pokes the reconciler so a campaign whose lead time has already begun is acted on at once.

The schedule file (JSON or TOML, a list of campaigns) has replace-by-id semantics: every entry overwrites
the stored campaign with its id; a campaign the file no longer lists is deleted only if this daemon saw the
file list it before (so campaigns booked through the API are never touched by the file). A file that does
not parse or validate changes nothing and is reported with the entry and field at fault.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from warmer.core.campaigns import CampaignDraft, CampaignInvalid, build_campaign
from warmer.core.errors import WarmerError
from warmer.core.model import Campaign
from warmer.ports import StorePort


class ScheduleFileInvalid(WarmerError):
    """The schedule file cannot be read or an entry is wrong; `where` names the entry and field."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where


class CampaignService:
    """Put / delete / list campaigns; every change is validated first and pokes the reconciler after."""

    def __init__(
        self,
        store: StorePort,
        known_agents: Callable[[], Collection[str]],
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self._store = store
        self._known_agents = known_agents
        self._on_change = on_change

    async def put(self, draft: CampaignDraft) -> tuple[Campaign, bool]:
        """Validate and store (insert or replace by id). Returns the stored campaign and whether it is new."""
        campaign = build_campaign(draft, self._known_agents())
        store = self._store
        existing = {c.id for c in await store.list_campaigns()}
        await store.put_campaign(campaign)
        self._on_change()
        return campaign, campaign.id not in existing

    async def delete(self, campaign_id: str) -> bool:
        deleted = await self._store.delete_campaign(campaign_id)
        if deleted:
            self._on_change()
        return deleted

    async def list(self) -> list[Campaign]:
        return await self._store.list_campaigns()


def read_schedule_file(path: Path, known_agents: Collection[str]) -> list[Campaign]:
    """Parse and validate every entry; the first problem raises `ScheduleFileInvalid` naming it.

    JSON: a list of objects, or {"campaigns": [...]}. TOML: `[[campaigns]]` tables. Keys per entry:
    id, agent, starts_at, ends_at, expected_calls (as in `PUT /v1/campaigns/{id}`)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ScheduleFileInvalid(str(path), f"cannot read: {exc.strerror or exc}") from None
    data: Any
    try:
        data = tomllib.loads(raw.decode()) if path.suffix.lower() == ".toml" else json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ScheduleFileInvalid(str(path), f"does not parse: {exc}") from None
    if isinstance(data, dict):
        data = data.get("campaigns", None)
    if not isinstance(data, list):
        raise ScheduleFileInvalid("campaigns", "expected a list of campaigns (or a `campaigns` list)")
    campaigns: list[Campaign] = []
    seen: set[str] = set()
    allowed = {"id", "agent", "starts_at", "ends_at", "expected_calls"}
    for index, entry in enumerate(data):
        where = f"campaigns[{index}]"
        if not isinstance(entry, dict):
            raise ScheduleFileInvalid(where, "expected a table/object")
        unknown = sorted(set(entry) - allowed)
        if unknown:
            raise ScheduleFileInvalid(f"{where}.{unknown[0]}", "unknown key")
        missing = [key for key in ("id", "agent", "starts_at", "ends_at") if key not in entry]
        if missing:
            raise ScheduleFileInvalid(f"{where}.{missing[0]}", "required")
        draft = CampaignDraft(
            id=entry["id"],
            agent=entry["agent"],
            starts_at=entry["starts_at"],
            ends_at=entry["ends_at"],
            expected_calls=entry.get("expected_calls", 0),
        )
        try:
            campaign = build_campaign(draft, known_agents)
        except CampaignInvalid as exc:
            raise ScheduleFileInvalid(f"{where}.{exc.field}", exc.message) from None
        if campaign.id in seen:
            raise ScheduleFileInvalid(f"{where}.id", f"duplicate id {campaign.id!r}")
        seen.add(campaign.id)
        campaigns.append(campaign)
    return campaigns


class ScheduleFileSync:
    """Brings the store in line with the schedule file; `sync()` is called on a timer by the root."""

    def __init__(
        self,
        path: Path,
        store: StorePort,
        known_agents: Callable[[], Collection[str]],
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.path = path
        self._store = store
        self._known_agents = known_agents
        self._on_change = on_change
        self._from_file: set[str] = set()  # ids the file listed at the last good read
        self.last_error: str | None = None

    async def sync(self) -> tuple[int, int]:
        """One pass: (written, deleted). A bad file raises `ScheduleFileInvalid` and changes nothing."""
        try:
            campaigns = read_schedule_file(self.path, self._known_agents())
        except ScheduleFileInvalid as exc:
            self.last_error = str(exc)
            raise
        self.last_error = None
        store = self._store
        stored = {c.id: c for c in await store.list_campaigns()}
        written = await self._write_changed(store, campaigns, stored)
        listed = {c.id for c in campaigns}
        deleted = 0
        for gone in sorted(self._from_file - listed):
            deleted += bool(await store.delete_campaign(gone))
        self._from_file = listed
        if written or deleted:
            self._on_change()
        return written, deleted

    @staticmethod
    async def _write_changed(
        store: StorePort, campaigns: Sequence[Campaign], stored: dict[str, Campaign]
    ) -> int:
        written = 0
        for campaign in campaigns:
            if stored.get(campaign.id) != campaign:
                await store.put_campaign(campaign)
                written += 1
        return written
