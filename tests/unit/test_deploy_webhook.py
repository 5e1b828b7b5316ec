"""`POST /v1/events/deploy` over httpx.ASGITransport: the real DeployService and Reconciler on a fake engine,
a fake clock and a real SqlStore (temp SQLite). The engine's own log shows what was sent, so "changes
nothing" is checked on the engine, the routes, the event log and the store."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from tests.unit.reconciler_fakes import FakeClock, FakeEngine, SpecTextPrefixSource, agent, settle, world
from warmer.adapters.store import SqlStore, upgrade_database
from warmer.api import ApiServices, Readiness, create_app
from warmer.core.event_kinds import EventKind
from warmer.core.model import BoxSpec, WarmState
from warmer.core.webhook import SIGNATURE_HEADER, BoxUrlPolicy, sign_body
from warmer.service.fleet.deploy import DeployResult, DeployService, WebhookConfig, rollout_epoch_tag
from warmer.service.reconciler import Reconciler

SECRET = "deploy-secret"
ALLOWED = ("http://10.0.9.*:8080",)


def spec_data(text: str) -> dict[str, Any]:
    return {
        "model": "m",
        "blocks": [{"name": "persona", "text": text}],
        "dynamic": {"template": "Customer: {customer_name}"},
        "placeholders": {"customer_name": "name"},
    }


@dataclass
class Hook:
    reconciler: Reconciler
    engine: FakeEngine
    store: SqlStore
    clock: FakeClock
    service: DeployService
    results: list[DeployResult]
    registered: list[list[str]]

    def post(self, body: bytes, signature: str | None) -> httpx.Response:
        app = create_app(
            ApiServices(
                registry=CollectorRegistry(), readiness=_ready, deploy=self.service
            )  # fresh app per call
        )

        async def call() -> httpx.Response:
            headers = {"content-type": "application/json"}
            if signature is not None:
                headers[SIGNATURE_HEADER] = signature
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://warmer") as client:
                return await client.post("/v1/events/deploy", content=body, headers=headers)

        return asyncio.run(call())

    def send(self, event: Mapping[str, Any], *, age: float = 0.0, secret: str = SECRET) -> httpx.Response:
        body = json.dumps(event).encode()
        return self.post(body, sign_body(body, secret, int(self.clock.now() - age)))

    def settle(self) -> None:
        asyncio.run(settle(self.reconciler))

    def routes(self, agent_id: str = "sales") -> tuple[str | None, list[str]]:
        snapshot = self.reconciler.snapshot()
        computed = snapshot.prefixes.get(agent_id)
        found = sorted(route.box_id for route in snapshot.routes().get(agent_id, ()))
        return (computed.prefix.hash if computed else None), found

    def events(self) -> list[tuple[str, str | None]]:
        return [(e.kind, e.box_id) for e in asyncio.run(self.store.events(limit=10_000))]


async def _ready() -> Readiness:
    return Readiness(True)


@pytest.fixture
def hook(tmp_path: Path) -> Hook:
    url = f"sqlite:///{tmp_path / 'warmer.db'}"
    upgrade_database(url)
    built = world(
        url,
        specs={"sales": agent("sales", "You sell things. Version one.")},
        source=SpecTextPrefixSource(),
    )
    reconciler, engine, store, clock = built.reconciler, built.engine, built.store, built.clock
    results: list[DeployResult] = []
    registered: list[list[str]] = []

    def on_fleet_change(fleet: Sequence[BoxSpec]) -> None:
        registered.append(sorted(box.id for box in fleet))

    service = DeployService(
        store=store,
        clock=clock,
        config=WebhookConfig(
            secrets=(SECRET,), tolerance_seconds=300.0, box_url_policy=BoxUrlPolicy(ALLOWED)
        ),
        fleet=reconciler,
        on_fleet_change=on_fleet_change,
        on_result=results.append,
    )
    hooked = Hook(reconciler, engine, store, clock, service, results, registered)
    hooked.settle()
    assert hooked.routes()[1] == ["b1", "b2"]
    return hooked


def event(kind: str, event_id: str, **fields: Any) -> dict[str, Any]:
    return {"id": event_id, "kind": kind, "occurred_at": "2025-01-31T12:00:00Z", **fields}


def prompt_change(event_id: str, text: str = "You sell things. Version two.") -> dict[str, Any]:
    return event("agent.prompt_changed", event_id, agent_id="sales", spec=spec_data(text))


# ------------------------------------------------------------------------------------------ accepted


def test_a_prompt_change_is_warmed_on_the_agents_boxes_before_routes_switch(hook: Hook) -> None:
    old_hash, _ = hook.routes()
    assert old_hash is not None
    response = hook.send(prompt_change("evt-1"))
    assert response.status_code == 202
    assert response.json() == {"outcome": "accepted", "event_id": "evt-1", "kind": "agent.prompt_changed",
                               "accepted": True}  # fmt: skip

    hook.engine.gate = asyncio.Event()  # hold every warm: the new prefix is being warmed, not yet warm

    async def first_tick() -> None:
        await hook.reconciler.tick()
        for _ in range(5):
            await asyncio.sleep(0)
        # warming in flight on both boxes, and the routes still serve the OLD prefix on both
        snapshot = hook.reconciler.snapshot()
        assert snapshot.prefixes["sales"].prefix.hash == old_hash
        assert sorted(r.box_id for r in snapshot.routes()["sales"]) == ["b1", "b2"]
        assert hook.engine.gate is not None
        hook.engine.gate.set()
        await hook.reconciler.wait_idle()

    asyncio.run(first_tick())
    hook.engine.gate = None
    hook.settle()
    new_hash, routed = hook.routes()
    assert new_hash is not None
    assert new_hash != old_hash
    assert routed == ["b1", "b2"]
    # the new prefix was verified on both boxes before it became current, and the old one was released
    snapshot = hook.reconciler.snapshot()
    for box_id in ("b1", "b2"):
        epoch = snapshot.live[box_id].epoch
        assert epoch is not None
        assert snapshot.records[(box_id, epoch, new_hash)].state is WarmState.WARM
        assert snapshot.records[(box_id, epoch, old_hash)].state is WarmState.COLD
    history = asyncio.run(hook.store.events(limit=10_000))
    kinds = [e.kind for e in history]
    assert "deploy_event" in kinds
    assert "prompt_staged" in kinds
    assert "prompt_current" in kinds
    current = next(e for e in history if e.kind == "prompt_current")
    verified_new = [
        e.at for e in history
        if e.prefix_hash == new_hash and e.kind == "warm_transition" and "verified" in str(e.detail)
    ]  # fmt: skip
    assert current.detail["previous_prefix"] == old_hash
    assert current.detail["reason"] == "verified warm on every routed box"
    assert len(verified_new) >= 2
    assert max(verified_new) <= current.at


def test_a_rollout_drains_boxes_onto_warm_ones_and_brings_them_back_warm_as_a_new_epoch(hook: Hook) -> None:
    restart_prompts_before = len([p for p in hook.engine.prompts if p[0] == "b1"])
    assert hook.send(event("rollout.started", "roll-1", box_ids=["b1"])).status_code == 202
    assert hook.reconciler.drained_boxes() == frozenset()  # still serving until the next pass moves it
    hook.settle()
    # the agent is warm on b2 already: b1 leaves its route, is drained and not ready
    assert hook.routes()[1] == ["b2"]
    assert hook.reconciler.drained_boxes() == {"b1"}
    assert "b1" not in (hook.reconciler.ready_box_ids() or set())
    hook.engine.restart("b1")  # the rollout restarts the engine
    hook.settle()
    assert hook.routes()[1] == ["b2"]  # still drained: nothing is warmed there mid-rollout
    assert len([p for p in hook.engine.prompts if p[0] == "b1"]) == restart_prompts_before

    assert hook.send(event("rollout.finished", "roll-2", box_ids=["b1"])).status_code == 202
    hook.settle()
    assert hook.routes()[1] == ["b1", "b2"]
    epoch = hook.reconciler.snapshot().live["b1"].epoch
    assert epoch == f"gen-1~{rollout_epoch_tag('roll-2')}"
    assert (
        len([p for p in hook.engine.prompts if p[0] == "b1"]) > restart_prompts_before
    )  # restart warm-up ran
    kinds = hook.events()
    assert ("box_drained", "b1") in kinds
    assert ("box_undrained", "b1") in kinds


def test_a_rollout_finished_without_a_restart_still_gets_a_fresh_warm_up(hook: Hook) -> None:
    epoch_before = hook.reconciler.snapshot().live["b2"].epoch
    prompts_before = len(hook.engine.prompts)
    assert hook.send(event("rollout.started", "r-a", box_ids=["b2"])).status_code == 202
    assert hook.send(event("rollout.finished", "r-b", box_ids=["b2"])).status_code == 202
    hook.settle()
    live = hook.reconciler.snapshot().live["b2"]
    assert live.epoch != epoch_before
    assert live.epoch == f"{epoch_before}~{rollout_epoch_tag('r-b')}"
    assert len(hook.engine.prompts) > prompts_before
    assert hook.routes()[1] == ["b1", "b2"]


def test_box_added_must_pass_the_allowlist_and_box_removed_leaves_the_fleet(hook: Hook) -> None:
    outside = event("box.added", "add-0", box={"id": "b3", "base_url": "http://169.254.169.254:80",
                                               "engine": "llamacpp", "model": "m"})  # fmt: skip
    response = hook.send(outside)
    assert response.status_code == 422
    assert [p["field"] for p in response.json()["problems"]] == ["box.base_url"]
    assert "b3" not in hook.reconciler.fleet()

    hook.engine.boxes["b3"] = type(hook.engine.boxes["b1"])()
    inside = event("box.added", "add-1", box={"id": "b3", "base_url": "http://10.0.9.3:8080",
                                              "engine": "llamacpp", "model": "m", "slots": 2})  # fmt: skip
    assert hook.send(inside).status_code == 202
    assert hook.registered[-1] == ["b1", "b2", "b3"]  # the engine client may call it before the first poll
    hook.settle()
    assert hook.reconciler.snapshot().live["b3"].healthy
    assert hook.engine.prompts
    assert any(p[0] == "b3" for p in hook.engine.prompts)

    assert hook.send(event("box.removed", "rm-1", box_id="b3")).status_code == 202
    assert "b3" not in hook.reconciler.fleet()
    assert hook.registered[-1] == ["b1", "b2"]
    hook.settle()
    assert hook.routes()[1] == ["b1", "b2"]
    # One row per fact, the store's, whatever added the box (oldest first here); the deploy event row
    # names its cause.
    rows = list(reversed(asyncio.run(hook.store.events(limit=10_000))))
    fleet = [
        (e.kind, e.detail) for e in rows if e.box_id == "b3" and e.kind.startswith(("box_add", "box_rem"))
    ]
    added = {
        "base_url": "http://10.0.9.3:8080",
        "engine": "llamacpp",
        "model": "m",
        "slots": 2,
        "group": "",
    }
    assert fleet == [
        (EventKind.BOX_ADDED, added),
        (EventKind.BOX_REMOVED, {"base_url": "http://10.0.9.3:8080"}),
    ]
    assert not [e for e in rows if e.kind.startswith("fleet_")]
    deploys = [e.detail for e in rows if e.kind == EventKind.DEPLOY_EVENT]
    assert [(d["event_id"], d.get("box_id")) for d in deploys if d.get("box_id")] == [
        ("add-1", "b3"),
        ("rm-1", "b3"),
    ]


# ------------------------------------------------------------------------------- rejected, nothing changes


def _state(hook: Hook) -> tuple[Any, ...]:
    snapshot = hook.reconciler.snapshot()
    return (
        hook.routes(),
        sorted((k, r.state) for k, r in snapshot.records.items()),
        len(hook.events()),
        len(hook.engine.log),
        dict(hook.reconciler.pending_prompts()),
        dict(hook.reconciler.draining()),
    )


@pytest.mark.parametrize(
    ("signature", "reason"),
    [
        (None, "unsigned"),
        ("t=1,v1=zz", "unsigned"),
        ("forged", "forged"),
        ("wrong-secret", "forged"),
        ("stale", "stale"),
        ("future", "stale"),
    ],
)
def test_unauthenticated_deliveries_get_401_and_change_nothing(
    hook: Hook, signature: str | None, reason: str
) -> None:
    before = _state(hook)
    body = json.dumps(event("rollout.started", "evt-x", box_ids=["b1", "b2"])).encode()
    now = int(hook.clock.now())
    header = {
        "forged": sign_body(body + b" ", SECRET, now),  # signed over different bytes
        "wrong-secret": sign_body(body, "not-the-secret", now),
        "stale": sign_body(body, SECRET, now - 301),
        "future": sign_body(body, SECRET, now + 301),
    }.get(signature or "", signature)
    response = hook.post(body, header)
    assert response.status_code == 401
    assert response.json()["outcome"] == reason
    assert response.headers["www-authenticate"].startswith("Signature")
    hook.settle()
    assert _state(hook) == before
    # the id was not consumed: the same event, properly signed, is then accepted
    assert hook.send(event("rollout.started", "evt-x", box_ids=["b1", "b2"])).status_code == 202


def test_a_repeated_event_id_is_acknowledged_and_changes_nothing(hook: Hook) -> None:
    assert hook.send(event("rollout.started", "once", box_ids=["b1"])).status_code == 202
    assert hook.send(event("rollout.finished", "twice", box_ids=["b1"])).status_code == 202
    hook.settle()
    before = _state(hook)
    replay = hook.send(event("rollout.started", "once", box_ids=["b1"]), age=200)  # within the tolerance
    assert replay.status_code == 200
    assert replay.json()["duplicate"] is True
    hook.settle()
    assert _state(hook) == before
    assert hook.routes()[1] == ["b1", "b2"]
    # the same captured body after the tolerance: 401 stale, whatever its id
    assert hook.send(event("rollout.started", "once", box_ids=["b1"]), age=400).status_code == 401


def test_malformed_and_invalid_bodies_name_what_is_wrong(hook: Hook) -> None:
    before = _state(hook)
    not_json = b"{not json"
    response = hook.post(not_json, sign_body(not_json, SECRET, int(hook.clock.now())))
    assert response.status_code == 400
    assert response.json()["problems"][0]["field"] == "(body)"

    missing = {"id": "bad-1", "kind": "rollout.started", "occurred_at": "2025-01-31T12:00:00Z"}
    response = hook.send(missing)
    assert response.status_code == 422
    assert [p["field"] for p in response.json()["problems"]] == ["box_ids"]

    response = hook.send(event("rollout.started", "bad-2", box_ids=["b1", "nope"]))
    assert response.status_code == 422
    assert response.json()["problems"] == [{"field": "box_ids[1]", "message": "unknown box 'nope'"}]

    with_file = spec_data("x")
    with_file["blocks"] = [{"name": "persona", "file": "/etc/passwd"}]
    response = hook.send(event("agent.prompt_changed", "bad-3", agent_id="sales", spec=with_file))
    assert response.status_code == 422
    assert response.json()["problems"][0]["field"] == "spec.blocks[0].file"

    mismatched = event(
        "agent.prompt_changed", "bad-4", agent_id="nobody", spec=spec_data("x") | {"id": "sales"}
    )
    response = hook.send(mismatched)
    assert response.status_code == 422
    assert any(p["field"] == "spec.id" for p in response.json()["problems"])

    unknown_agent = event("agent.prompt_changed", "bad-5", agent_id="nobody",
                          spec=spec_data("x") | {"id": "nobody"})  # fmt: skip
    response = hook.send(unknown_agent)
    assert response.status_code == 422
    assert response.json()["problems"] == [{"field": "agent_id", "message": "unknown agent 'nobody'"}]
    assert "new id" in response.json()["detail"]  # fleet checks run after the id is remembered
    hook.settle()
    after = _state(hook)
    assert after[:2] == before[:2]
    assert after[3:] == before[3:]
    assert [k for k, _ in hook.events()[: after[2] - before[2]]] == ["deploy_event_rejected"] * 2


def test_the_webhook_is_disabled_without_a_secret(hook: Hook) -> None:
    disabled = DeployService(
        store=hook.store,
        clock=hook.clock,
        config=WebhookConfig(secrets=()),
        fleet=hook.reconciler,
    )
    hook.service = disabled
    response = hook.send(event("rollout.started", "x", box_ids=["b1"]))
    assert response.status_code == 503
    assert "webhook_secret" in response.json()["detail"]
    assert hook.routes()[1] == ["b1", "b2"]


def test_a_newer_prompt_change_replaces_a_pending_one(hook: Hook) -> None:
    old_hash, _ = hook.routes()
    hook.engine.boxes["b1"].healthy = hook.engine.boxes["b2"].healthy = True
    assert hook.send(prompt_change("p-1", "Version A.")).status_code == 202
    assert hook.send(prompt_change("p-2", "Version B, the one that counts.")).status_code == 202
    hook.settle()
    current = hook.reconciler.snapshot().prefixes["sales"]
    assert current.prefix.text == "Version B, the one that counts."
    assert hook.routes()[1] == ["b1", "b2"]
    assert hook.routes()[0] != old_hash
    assert hook.reconciler.pending_prompts() == {}
