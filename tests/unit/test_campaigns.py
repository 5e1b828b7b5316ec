"""Dialer schedule: campaign validation, volume, the API, the schedule file, and the reconciler keeping a
campaign's agent warm from its lead time through its window (fake clock, counting fake engine, real
SqlStore on a temp SQLite file; nothing sleeps)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from tests.unit.reconciler_fakes import PREFIX_TOKENS, routed_boxes, settle, world
from warmer.adapters.store import SqlStore
from warmer.api import ApiServices, Readiness, create_app
from warmer.core.campaigns import (
    CampaignDraft,
    CampaignInvalid,
    UnknownCampaignAgent,
    build_campaign,
    calls_per_minute,
    campaign_demand,
    merge_demand,
    parse_instant,
)
from warmer.core.model import Campaign, WarmState
from warmer.core.placement import PlacementConfig
from warmer.core.planner import PlannerConfig
from warmer.core.warm_budget import WarmBudget
from warmer.service.dialer.campaigns import (
    CampaignService,
    ScheduleFileInvalid,
    ScheduleFileSync,
    read_schedule_file,
)

T0 = 1_700_000_000.0
TOKEN = "dialer-token"


# ------------------------------------------------------------------------------------------ validation


def test_instants_accept_iso_with_offset_and_unix_seconds() -> None:
    assert parse_instant("2023-11-14T22:13:20Z", "starts_at") == T0
    assert parse_instant("2023-11-15T00:13:20+02:00", "starts_at") == T0
    assert parse_instant(T0, "starts_at") == T0
    assert parse_instant(int(T0), "starts_at") == T0
    assert parse_instant(f"{T0}", "starts_at") == T0
    for bad, why in [
        ("2023-11-14T22:13:20", "offset"),  # naive: which zone? refused
        ("tomorrow", "not an ISO-8601"),
        (True, "boolean"),
        (None, "NoneType"),
        ("nan", "1970-01-01 to 9999-12-31"),
        (-5, "1970-01-01 to 9999-12-31"),
    ]:
        with pytest.raises(CampaignInvalid) as caught:
            parse_instant(bad, "ends_at")
        assert caught.value.field == "ends_at"
        assert why in caught.value.message


def test_build_campaign_names_the_field_at_fault() -> None:
    good = CampaignDraft("spring-1", "sales", "2023-11-14T22:13:20Z", T0 + 3600, 600)
    campaign = build_campaign(good, {"sales"})
    assert campaign == Campaign("spring-1", "sales", T0, T0 + 3600, 600)
    cases = [
        (CampaignDraft("bad id!", "sales", T0, T0 + 1), "id"),
        (CampaignDraft("", "sales", T0, T0 + 1), "id"),
        (CampaignDraft("-lead", "sales", T0, T0 + 1), "id"),
        (CampaignDraft("x" * 129, "sales", T0, T0 + 1), "id"),
        (CampaignDraft("c", "", T0, T0 + 1), "agent"),
        (CampaignDraft("c", "sales", T0, T0), "ends_at"),
        (CampaignDraft("c", "sales", T0, T0 - 10), "ends_at"),
        (CampaignDraft("c", "sales", T0, T0 + 1, -1), "expected_calls"),
        (CampaignDraft("c", "sales", T0, T0 + 1, 2.5), "expected_calls"),
    ]
    for draft, field in cases:
        with pytest.raises(CampaignInvalid) as caught:
            build_campaign(draft, {"sales"})
        assert caught.value.field == field, draft
    with pytest.raises(UnknownCampaignAgent):
        build_campaign(CampaignDraft("c", "support", T0, T0 + 1), {"sales"})


def test_volume_is_expected_calls_over_the_window_and_counts_from_the_lead_time() -> None:
    hour = Campaign("a", "sales", T0, T0 + 3600, 1200)
    assert calls_per_minute(hour) == pytest.approx(20.0)
    short = Campaign("b", "sales", T0, T0 + 10, 30)
    assert calls_per_minute(short) == pytest.approx(30.0)  # a sub-minute window counts as one minute
    other = Campaign("c", "support", T0 + 7200, T0 + 9000, 90)
    assert campaign_demand([hour, short, other], T0 - 400, lead_seconds=300) == {}
    assert campaign_demand([hour, short, other], T0 - 299, lead_seconds=300) == pytest.approx({"sales": 50.0})
    assert campaign_demand([hour, short, other], T0 + 3600, lead_seconds=300) == {}  # window over
    assert merge_demand({"sales": 5.0}, {"sales": 9.0, "support": 1.0}) == {"sales": 9.0, "support": 1.0}


# ---------------------------------------------------------------------------------------------- the API


def api_client(service: CampaignService) -> httpx.AsyncClient:
    async def ready() -> Readiness:
        return Readiness(True)

    app = create_app(
        ApiServices(
            registry=CollectorRegistry(), readiness=ready, tokens=(SecretStr(TOKEN),), campaigns=service
        )
    )
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://warmer.test",
        headers={"authorization": f"Bearer {TOKEN}"},
    )


def test_campaign_api_put_replace_list_delete_and_errors(store_url: str) -> None:
    async def scenario() -> None:
        store = SqlStore.from_url(store_url)
        pokes: list[int] = []
        service = CampaignService(store, lambda: {"sales"}, on_change=lambda: pokes.append(1))
        async with api_client(service) as client:
            body = {
                "agent": "sales",
                "starts_at": "2023-11-14T22:13:20Z",
                "ends_at": T0 + 1800,
                "expected_calls": 300,
            }
            created = await client.put("/v1/campaigns/spring-1", json=body)
            assert created.status_code == 201, created.text
            assert created.json()["starts_at"] == T0
            assert created.json()["ends_at_iso"] == "2023-11-14T22:43:20Z"
            assert created.json()["calls_per_minute"] == pytest.approx(10.0)
            replaced = await client.put("/v1/campaigns/spring-1", json=body | {"expected_calls": 600})
            assert replaced.status_code == 200
            assert await store.list_campaigns() == [Campaign("spring-1", "sales", T0, T0 + 1800, 600)]
            assert len(pokes) == 2

            listed = await client.get("/v1/campaigns")
            assert [c["id"] for c in listed.json()["campaigns"]] == ["spring-1"]

            for path, bad, field, code in [
                ("/v1/campaigns/spring-2", body | {"ends_at": T0 - 1}, "ends_at", 422),
                ("/v1/campaigns/spring-2", body | {"starts_at": "soon"}, "starts_at", 422),
                ("/v1/campaigns/spring-2", {k: v for k, v in body.items() if k != "agent"}, "agent", 422),
                ("/v1/campaigns/spring-2", body | {"expected_calls": "many"}, "expected_calls", 422),
                ("/v1/campaigns/spring-2", body | {"colour": "red"}, "colour", 422),
                ("/v1/campaigns/bad%20id", body, "id", 422),
                ("/v1/campaigns/spring-2", body | {"agent": "support"}, "agent", 404),
            ]:
                response = await client.put(path, json=bad)
                assert response.status_code == code, (bad, response.text)
                assert response.json()["field"] == field
            not_json = await client.put(
                "/v1/campaigns/spring-2", content=b"{", headers={"content-type": "application/json"}
            )
            assert not_json.status_code == 400  # not JSON at all: malformed, not a bad field
            assert not_json.json()["field"] == "body"
            assert [c.id for c in await store.list_campaigns()] == ["spring-1"]  # nothing changed

            no_token = await client.put("/v1/campaigns/spring-2", json=body, headers={"authorization": ""})
            assert no_token.status_code == 401

            assert (await client.delete("/v1/campaigns/spring-1")).status_code == 204
            assert (await client.delete("/v1/campaigns/spring-1")).status_code == 404
            assert await store.list_campaigns() == []
        await store.close()

    asyncio.run(scenario())


# ------------------------------------------------------------------------------------- schedule file


def test_schedule_file_replaces_by_id_and_never_touches_api_campaigns(store_url: str, tmp_path: Path) -> None:
    async def scenario() -> None:
        store = SqlStore.from_url(store_url)
        api_booked = Campaign("api-1", "sales", T0, T0 + 60, 5)
        await store.put_campaign(api_booked)
        path = tmp_path / "schedule.json"
        entries = [
            {"id": "file-1", "agent": "sales", "starts_at": "2023-11-14T22:13:20Z", "ends_at": T0 + 600},
            {
                "id": "file-2",
                "agent": "sales",
                "starts_at": T0 + 900,
                "ends_at": T0 + 1800,
                "expected_calls": 40,
            },
        ]
        path.write_text(json.dumps(entries))
        sync = ScheduleFileSync(path, store, lambda: {"sales"})
        assert await sync.sync() == (2, 0)
        assert await sync.sync() == (0, 0)  # unchanged file: no writes
        assert {c.id for c in await store.list_campaigns()} == {"api-1", "file-1", "file-2"}

        entries[0]["ends_at"] = T0 + 1200
        path.write_text(json.dumps({"campaigns": entries[:1]}))  # file-2 dropped, file-1 changed
        assert await sync.sync() == (1, 1)
        stored = {c.id: c for c in await store.list_campaigns()}
        assert set(stored) == {"api-1", "file-1"}
        assert stored["file-1"].ends_at == T0 + 1200
        assert stored["api-1"] == api_booked

        path.write_text(json.dumps([{"id": "file-3", "agent": "nobody", "starts_at": T0, "ends_at": T0 + 1}]))
        with pytest.raises(ScheduleFileInvalid) as caught:
            await sync.sync()
        assert caught.value.where == "campaigns[0].agent"
        assert set(c.id for c in await store.list_campaigns()) == {"api-1", "file-1"}  # nothing changed
        await store.close()

    asyncio.run(scenario())


def test_schedule_file_in_toml_and_its_errors(tmp_path: Path) -> None:
    path = tmp_path / "schedule.toml"
    native = '[[campaigns]]\nid = "t1"\nagent = "sales"\nstarts_at = 2023-11-14T22:13:20Z\n'
    path.write_text(native + 'ends_at = "2023-11-14T23:13:20Z"\nexpected_calls = 120\n')
    assert read_schedule_file(path, {"sales"}) == [Campaign("t1", "sales", T0, T0 + 3600, 120)]
    path.write_text(native + "ends_at = 2023-11-14T23:13:20\n")  # a local datetime: which zone? refused
    with pytest.raises(ScheduleFileInvalid) as caught:
        read_schedule_file(path, {"sales"})
    assert caught.value.where == "campaigns[0].ends_at"
    path.write_text(
        '[[campaigns]]\nid = "t1"\nagent = "sales"\nstarts_at = "2023-11-14T22:13:20Z"\n'
        'ends_at = "2023-11-14T23:13:20Z"\nexpected_calls = 120\n'
    )
    assert read_schedule_file(path, {"sales"}) == [Campaign("t1", "sales", T0, T0 + 3600, 120)]
    for text, where in [
        ("[[campaigns]]\nid = 't1'\n", "campaigns[0].agent"),
        ("[[campaigns]]\nid='a'\nagent='sales'\nstarts_at=1\nends_at=2\nnote='x'\n", "campaigns[0].note"),
        ("campaigns = 3\n", "campaigns"),
        ("[[campaigns]\n", str(path)),
    ]:
        path.write_text(text)
        with pytest.raises(ScheduleFileInvalid) as caught:
            read_schedule_file(path, {"sales"})
        assert caught.value.where == where
    dup = tmp_path / "dup.json"
    one = {"id": "d", "agent": "sales", "starts_at": 1, "ends_at": 2}
    dup.write_text(json.dumps([one, one]))
    with pytest.raises(ScheduleFileInvalid) as caught:
        read_schedule_file(dup, {"sales"})
    assert caught.value.where == "campaigns[1].id"


# ------------------------------------------------------------------- the reconciler keeps it warm


def test_a_campaign_gets_its_prefix_warm_before_the_window_keeps_it_warm_and_releases_it(
    store_url: str,
) -> None:
    lead = 300.0
    planner = PlannerConfig(
        budget=WarmBudget(max_concurrent=2, tokens_per_second=1e6),
        campaign_lead_seconds=lead,
        retire_idle_after_seconds=60.0,
    )

    async def scenario() -> None:
        w = world(store_url, planner=planner)
        await settle(w.reconciler)  # restart warm-ups; the new agent is warmed once, then goes idle
        w.clock.t += 120.0
        await settle(w.reconciler)
        assert routed_boxes(w.reconciler, "sales") == []  # idle: released
        released = {r.box_id: r.state for r in await w.store.list_warm()}
        assert set(released.values()) == {WarmState.COLD}
        for box_id in ("b1", "b2"):
            w.engine.restart(box_id)  # cold caches: a warm must really send the prefix again
        await settle(w.reconciler)
        sent_before = sum(w.engine.warm_requests.values())

        starts = w.clock.t + 1000.0
        ends = starts + 900.0
        await w.store.put_campaign(Campaign("evening", "sales", starts, ends, 90))

        w.clock.t = starts - lead - 1.0  # before the lead time: nothing to do yet
        await settle(w.reconciler)
        assert sum(w.engine.warm_requests.values()) == sent_before
        assert routed_boxes(w.reconciler, "sales") == []

        w.clock.t = starts - lead + 1.0  # inside the lead time, before the window opens
        await settle(w.reconciler)
        assert routed_boxes(w.reconciler, "sales") == ["b1", "b2"]
        first_warms = [t for _, kind, t in w.engine.prefix_log if kind == "warm"][sent_before:]
        assert first_warms
        assert max(first_warms) < starts  # warm before the window
        records = await w.store.list_warm()
        assert {r.state for r in records} == {WarmState.WARM}
        assert all(r.verified_at is not None and r.verified_at < starts for r in records)

        # Through the window: keepalive touches (every <= 240 s here) keep it routed to the end.
        touches_before = sum(w.engine.warm_requests.values())
        t = starts - lead + 1.0
        while t < ends - 1.0:
            t = min(t + 100.0, ends - 1.0)
            w.clock.t = t
            await settle(w.reconciler, rounds=3)
            assert routed_boxes(w.reconciler, "sales") == ["b1", "b2"], t
        assert sum(w.engine.warm_requests.values()) > touches_before  # kept alive, not left to age out

        w.clock.t = ends + 1.0  # window over, no traffic since: released
        await settle(w.reconciler)
        assert routed_boxes(w.reconciler, "sales") == []
        after = sum(w.engine.warm_requests.values())
        w.clock.t += 1000.0
        await settle(w.reconciler)
        assert sum(w.engine.warm_requests.values()) == after  # no keepalive after release
        await w.store.close()

    asyncio.run(scenario())


def test_a_campaign_survives_a_daemon_restart_because_it_lives_in_the_store(store_url: str) -> None:
    planner = PlannerConfig(
        budget=WarmBudget(max_concurrent=2, tokens_per_second=1e6),
        campaign_lead_seconds=300.0,
        retire_idle_after_seconds=60.0,
    )

    async def scenario() -> None:
        first = world(store_url, planner=planner)
        service = CampaignService(first.store, lambda: {"sales"}, on_change=first.reconciler.poke)
        starts = first.clock.t + 3600.0
        await service.put(CampaignDraft("night", "sales", starts, starts + 600, 10))
        await first.reconciler.close()
        await first.store.close()

        second = world(store_url, planner=planner)  # a new daemon over the same database
        second.clock.t = starts - 100.0
        await settle(second.reconciler)
        assert routed_boxes(second.reconciler, "sales") == ["b1", "b2"]
        await second.store.close()

    asyncio.run(scenario())


def test_campaign_volume_widens_the_agents_group_and_narrows_it_after(store_url: str) -> None:
    boxes = [f"b{i}" for i in range(6)]
    planner = PlannerConfig(
        budget=WarmBudget(max_concurrent=2, tokens_per_second=1e6),
        campaign_lead_seconds=300.0,
        retire_idle_after_seconds=None,
    )
    placement = PlacementConfig(min_group_size=2, max_group_size=6, calls_per_minute_per_box=10.0)

    async def scenario() -> None:
        w = world(store_url, box_ids=boxes, planner=planner, placement=placement)
        await settle(w.reconciler)
        assert len(routed_boxes(w.reconciler, "sales")) == 2
        starts = w.clock.t + 600.0
        # 1,800 calls in 30 minutes = 60 calls/minute -> 6 boxes at 10 calls/minute per box.
        await w.store.put_campaign(Campaign("blitz", "sales", starts, starts + 1800.0, 1800))
        w.clock.t = starts - 200.0
        await settle(w.reconciler)
        assert len(routed_boxes(w.reconciler, "sales")) == 6  # widened (and warmed) before the window
        assert min(t for _, kind, t in w.engine.prefix_log if kind == "warm" and t > starts - 300) < starts
        w.clock.t = starts + 1801.0
        await settle(w.reconciler)
        desired = w.reconciler.snapshot().desired
        assert desired is not None
        assert len(desired.assignment["sales"]) == 2  # back to its quiet size
        assert PREFIX_TOKENS > 0
        await w.store.close()

    asyncio.run(scenario())
