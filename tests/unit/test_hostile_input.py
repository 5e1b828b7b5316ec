"""Hostile input at the front doors (prewarm, campaigns, the signed deploy webhook):
every case is a clear 4xx with a reason, nothing is stored, and the next request is served.

The stack is real (reconciler over a fake engine, SqlStore on a temp SQLite file, the real services): see
tests/unit/frontdoor_stack.py.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tests.unit.frontdoor_stack import Stack, build_stack
from warmer.config.settings import Settings
from warmer.core.jsonbody import MAX_JSON_DEPTH, JsonBodyRejected, nesting_depth, parse_json_body
from warmer.core.model import Campaign
from warmer.core.webhook import BoxUrlPolicy

T = TypeVar("T")
DEEP = b"[" * 2000 + b"]" * 2000
DEEP_OBJECT = b'{"a":' * 2000 + b"1" + b"}" * 2000
HUGE_NUMBER = b"9" * 5000
CAMPAIGN = {"agent": "sales", "starts_at": 1_700_000_000, "ends_at": 1_700_003_600, "expected_calls": 10}


def run(stack: Stack, scenario: Callable[[httpx.AsyncClient], Awaitable[T]]) -> T:
    async def go() -> T:
        async with stack.client() as client:
            return await scenario(client)

    return asyncio.run(go())


@pytest.fixture
def stack(tmp_path: Path) -> Stack:
    return build_stack(tmp_path)


def json_headers() -> dict[str, str]:
    return {"content-type": "application/json"}


# ------------------------------------------------------------------------------------------- the parser


def test_the_parser_refuses_what_python_json_would_turn_into_a_crash_or_a_wild_value() -> None:
    for raw, reason in [
        (DEEP, f"nested deeper than {MAX_JSON_DEPTH} levels"),
        (DEEP_OBJECT, f"nested deeper than {MAX_JSON_DEPTH} levels"),
        (b'{"a": ' + HUGE_NUMBER + b"}", "longer than 40 characters"),
        (b'{"a": -' + b"1" * 41 + b"}", "longer than 40 characters"),
        (b'{"a": 1e400}', "out of range"),
        (b'{"a": NaN}', "NaN is not JSON"),
        (b'{"a": -Infinity}', "-Infinity is not JSON"),
        (b"\xff\xfe{", "not valid JSON"),
        (b'{"a": [1}', "not valid JSON"),
        (b"", "not valid JSON"),
    ]:
        with pytest.raises(JsonBodyRejected) as caught:
            parse_json_body(raw)
        assert reason in caught.value.reason, raw[:40]


def test_the_parser_reads_ordinary_documents_and_ignores_brackets_and_digits_inside_strings() -> None:
    nested = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert nesting_depth(nested) == MAX_JSON_DEPTH
    assert parse_json_body(nested) is not None
    text = '{"a\\"[[[": "' + "[" * 500 + "9" * 500 + '", "n": [1.5e300, -12345678901234567890]}'
    assert parse_json_body(text.encode()) == {
        'a"[[[': "[" * 500 + "9" * 500,
        "n": [1.5e300, -12345678901234567890],
    }
    assert nesting_depth(text.encode()) == 2


@pytest.mark.timeout(20)
def test_the_parser_stays_linear_on_pathological_quoting() -> None:
    # every quote escaped: a string pattern that could fail and backtrack would be quadratic here
    with pytest.raises(JsonBodyRejected):
        parse_json_body(b'\\"' * 1_000_000)
    with pytest.raises(JsonBodyRejected):
        parse_json_body(b"[" * 2_000_000)


# ------------------------------------------------------------------------------------------- deep JSON


def test_json_nested_2000_deep_is_400_with_a_reason_at_every_front_door(stack: Stack) -> None:
    async def scenario(client: httpx.AsyncClient) -> list[httpx.Response]:
        prewarm = await client.post("/v1/prewarm", content=DEEP, headers=json_headers())
        campaign = await client.put("/v1/campaigns/deep", content=DEEP_OBJECT, headers=json_headers())
        webhook = await client.post("/v1/events/deploy", content=DEEP, headers=stack.signature(DEEP))
        after = await client.get("/v1/campaigns")  # the server is still there and nothing was stored
        return [prewarm, campaign, webhook, after]

    prewarm, campaign, webhook, after = run(stack, scenario)
    for response in (prewarm, campaign):
        assert response.status_code == 400, response.text
        assert response.json() == {
            "error": "malformed",
            "field": "body",
            "detail": f"JSON nested deeper than {MAX_JSON_DEPTH} levels",
        }
    assert webhook.status_code == 400, webhook.text
    assert webhook.json()["problems"] == [
        {"field": "(body)", "message": f"JSON nested deeper than {MAX_JSON_DEPTH} levels"}
    ]
    assert (after.status_code, after.json()) == (200, {"campaigns": []})


def test_a_5000_digit_number_in_a_signed_webhook_is_400_and_changes_nothing(stack: Stack) -> None:
    body = (
        b'{"id": "big-1", "kind": "rollout.started", "occurred_at": ' + HUGE_NUMBER + b', "box_ids": ["b1"]}'
    )

    async def scenario(client: httpx.AsyncClient) -> httpx.Response:
        return await client.post("/v1/events/deploy", content=body, headers=stack.signature(body))

    response = run(stack, scenario)
    assert response.status_code == 400, response.text
    assert response.json()["outcome"] == "malformed"
    assert "longer than 40 characters" in response.json()["detail"]
    assert stack.world.reconciler.snapshot().live["b1"].healthy  # not drained
    kinds = {e.kind for e in asyncio.run(stack.world.store.events(limit=1000))}
    assert "deploy_event" not in kinds
    assert "box_drained" not in kinds


@pytest.mark.parametrize(
    ("occurred_at", "status"),
    [(b"1e300", 422), (b"1e400", 400), (b"-1e300", 422), (b"NaN", 400), (b'"9999999-01-01T00:00:00Z"', 422)],
)
def test_out_of_range_times_in_a_signed_webhook_are_4xx(
    stack: Stack, occurred_at: bytes, status: int
) -> None:
    body = b'{"id": "t-1", "kind": "rollout.started", "occurred_at": ' + occurred_at + b', "box_ids": ["b1"]}'

    async def scenario(client: httpx.AsyncClient) -> httpx.Response:
        return await client.post("/v1/events/deploy", content=body, headers=stack.signature(body))

    response = run(stack, scenario)
    assert response.status_code == status, response.text
    assert stack.world.reconciler.snapshot().live["b1"].healthy


# ------------------------------------------------------------------------------ out-of-range campaigns


@pytest.mark.parametrize(
    ("field", "value", "status"),
    [
        ("starts_at", 1e300, 422),
        ("ends_at", 1e300, 422),
        ("ends_at", 253_402_300_800, 422),  # one second after 9999-12-31T23:59:59Z
        ("starts_at", "1e300", 422),
        ("starts_at", "0001-01-01T00:00:00Z", 422),
        ("starts_at", 10**300, 400),  # 301 digits: refused by the parser
        ("expected_calls", 10**30, 422),
    ],
)
def test_out_of_range_campaign_values_are_4xx_and_nothing_is_stored(
    stack: Stack, field: str, value: Any, status: int
) -> None:
    async def scenario(client: httpx.AsyncClient) -> tuple[httpx.Response, httpx.Response]:
        body = json.dumps(CAMPAIGN | {field: value})
        put = await client.put("/v1/campaigns/far", content=body, headers=json_headers())
        return put, await client.get("/v1/campaigns")

    put, listed = run(stack, scenario)
    assert put.status_code == status, put.text
    assert put.json()["field"] == (field if status == 422 else "body")
    assert (listed.status_code, listed.json()) == (200, {"campaigns": []})
    assert asyncio.run(stack.world.store.list_campaigns()) == []


def test_the_latest_representable_time_is_accepted_and_listed(stack: Stack) -> None:
    async def scenario(client: httpx.AsyncClient) -> tuple[httpx.Response, httpx.Response]:
        body = CAMPAIGN | {"ends_at": "9999-12-31T23:59:59Z"}
        return await client.put("/v1/campaigns/long", json=body), await client.get("/v1/campaigns")

    put, listed = run(stack, scenario)
    assert put.status_code == 201, put.text
    assert listed.json()["campaigns"][0]["ends_at_iso"] == "9999-12-31T23:59:59Z"


def test_a_bad_row_never_breaks_the_campaign_list(stack: Stack) -> None:
    # rows a daemon without the range checks stored (or someone wrote by hand)
    for campaign in (
        Campaign("far", "sales", 1e300, 1e301, 5),
        Campaign("endless", "sales", 1_700_000_000.0, math.inf, 5),
    ):
        asyncio.run(stack.world.store.put_campaign(campaign))

    async def scenario(client: httpx.AsyncClient) -> httpx.Response:
        await client.put("/v1/campaigns/good", json=CAMPAIGN)
        return await client.get("/v1/campaigns")

    response = run(stack, scenario)
    assert response.status_code == 200, response.text
    found = {c["id"]: c for c in response.json()["campaigns"]}
    assert set(found) == {"far", "endless", "good"}
    assert found["far"]["starts_at"] == 1e300
    assert found["far"]["starts_at_iso"] is None
    assert found["endless"]["ends_at"] is None
    assert found["endless"]["ends_at_iso"] is None
    assert found["good"]["starts_at_iso"] == "2023-11-14T22:13:20Z"


# ---------------------------------------------------------------------------------------- body limits


async def chunks(total: int, size: int = 16 * 1024) -> AsyncIterator[bytes]:
    sent = 0
    while sent < total:
        yield b" " * min(size, total - sent)
        sent += size


def test_bodies_over_the_configured_limits_are_413_whether_declared_or_streamed(tmp_path: Path) -> None:
    stack = build_stack(tmp_path, max_request_bytes=2048, webhook_max_body_bytes=4096)

    async def scenario(client: httpx.AsyncClient) -> list[httpx.Response]:
        big = b'{"agent": "sales", "call_id": "' + b"x" * 3000 + b'"}'
        answers = [
            await client.post("/v1/prewarm", content=big, headers=json_headers()),
            await client.put("/v1/campaigns/c", content=big, headers=json_headers()),
            # no content-length: the limit holds while the body streams in
            await client.post("/v1/prewarm", content=chunks(10 * 1024 * 1024), headers=json_headers()),
            await client.post("/v1/events/deploy", content=chunks(5000), headers=stack.signature(b"")),
        ]
        answers.append(await client.put("/v1/campaigns/c", json=CAMPAIGN))  # under the limit: served
        return answers

    *refused, accepted = run(stack, scenario)
    for response in refused[:3]:
        assert response.status_code == 413, response.text
        assert response.json() == {
            "error": "too_large",
            "detail": "body over 2048 bytes (limit set by api.max_request_bytes)",
        }
    assert refused[3].status_code == 413
    assert refused[3].json() == {
        "outcome": "too_large",
        "detail": "body over 4096 bytes (limit set by api.webhook_max_body_bytes)",
    }
    assert accepted.status_code == 201


def test_body_limits_have_sane_defaults_and_are_validated() -> None:
    api = Settings().api
    assert api.max_request_bytes == 64 * 1024
    assert api.webhook_max_body_bytes == 4 * 1024 * 1024
    assert Settings(api={"max_request_bytes": 8192}).api.max_request_bytes == 8192
    with pytest.raises(ValueError, match="max_request_bytes"):
        Settings(api={"max_request_bytes": 10})


def test_the_daemon_applies_the_configured_body_limit(tmp_path: Path) -> None:
    from warmer.root.app import build

    settings = Settings(api={"max_request_bytes": 1024}, database={"state_dir": str(tmp_path)})
    daemon = build(settings)

    async def scenario() -> httpx.Response:
        await daemon.open()  # the API is built over the open store
        try:
            transport = httpx.ASGITransport(app=daemon.api)
            async with httpx.AsyncClient(transport=transport, base_url="http://warmer") as client:
                return await client.put("/v1/campaigns/c", content=b"[" + b"1," * 1000 + b"1]")
        finally:
            await daemon.close()

    assert asyncio.run(scenario()).status_code == 413


# ------------------------------------------------------------------------------------- the URL allowlist


def test_the_allowlist_glob_never_reaches_across_a_colon_a_slash_or_a_dot() -> None:
    policy = BoxUrlPolicy(
        ("http://*.gpu.internal:18093", "http://10.0.3.*:30000", "https://*.example:443/v1/*")
    )
    for url in (
        "http://a7.gpu.internal:18093",
        "http://box-1.gpu.internal:18093/",
        "http://10.0.3.200:30000",
        "https://sglang.example:443/v1/rank0",
    ):
        assert policy.check(url) is None, url
    for url in (
        "http://127.0.0.1:9/.gpu.internal:18093",  # `*` would have matched `127.0.0.1:9/`
        "http://127.0.0.1:18093/.gpu.internal",
        "http://a.b.gpu.internal:18093",  # `*` is one host label
        "http://a7.gpu.internal:180930",
        "http://a7.gpu.internal:18093/extra",  # no path in the pattern: none allowed
        "http://10.0.3.evil.example:30000",  # a DNS name shaped like the subnet
        "http://10.0.3.evil:30000",
        "http://10.0.3.1:30000/x",
        "https://sglang.example:443/v1/rank0/admin",  # `*` is one path segment
        "https://sglang.example:443/v2/rank0",
    ):
        assert policy.check(url) is not None, url


def test_a_malformed_allowlist_pattern_is_refused_by_the_settings() -> None:
    with pytest.raises(ValueError, match="webhook_box_url_patterns"):
        Settings(api={"webhook_box_url_patterns": ["*.gpu.internal"]})


def test_box_added_through_the_webhook_uses_the_parsed_allowlist(stack: Stack) -> None:
    def box_added(event_id: str, url: str) -> dict[str, Any]:
        box = {"id": f"box-{event_id}", "base_url": url, "engine": "llamacpp", "model": "m"}
        return {"id": event_id, "kind": "box.added", "occurred_at": "2025-01-31T12:00:00Z", "box": box}

    async def scenario(client: httpx.AsyncClient) -> list[httpx.Response]:
        answers = []
        for event_id, url in (
            ("e1", "http://127.0.0.1:9/.gpu.internal:18093"),
            ("e2", "http://a7.gpu.internal:18093"),
        ):
            body, headers = stack.signed_event(box_added(event_id, url))
            answers.append(await client.post("/v1/events/deploy", content=body, headers=headers))
        return answers

    refused, accepted = run(stack, scenario)
    assert refused.status_code == 422, refused.text
    assert refused.json()["problems"][0]["field"] == "box.base_url"
    assert accepted.status_code == 202, accepted.text
    assert "box-e1" not in stack.world.reconciler.fleet()
    assert "box-e2" in stack.world.reconciler.fleet()
