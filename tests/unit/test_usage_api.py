"""`POST /v1/usage` and `GET /v1/usage`: the example call log replayed through the API gives the figures
`warmer hitrate --calls --json` prints for the file, and the turn-1 gauges on /metrics say the same."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from tests.call_log_world import EXAMPLE_LOG, WORLD
from tests.unit.reconciler_fakes import FakeClock
from tests.unit.test_api_app import services
from tests.unit.test_hitrate_calls import ROOT, report_of, run
from warmer.api import create_app
from warmer.config.agents import load_agent_specs
from warmer.config.loader import load_config
from warmer.config.profiles import load_profiles
from warmer.config.server_settings import DatabaseSettings
from warmer.core.agents import AgentSpec
from warmer.core.promtext import parse_prometheus_text
from warmer.root.app import build
from warmer.root.capacity import OfflineStablePrefixes
from warmer.root.metrics import Metrics
from warmer.service.usage import UsageService, UsageWindowConfig

TOKEN = "t0ken"
AUTH = {"authorization": f"Bearer {TOKEN}"}
BOXES = ("llama-1", "llama-2")


def usage_service(
    clock: FakeClock | None = None,
    agents: Sequence[str] = tuple(a.agent for a in WORLD),
    config: UsageWindowConfig | None = None,
    prefixes: OfflineStablePrefixes | None = None,
) -> UsageService:
    extra = {"stable_share": prefixes.stable_share} if prefixes is not None else {}
    return UsageService(
        clock=clock or FakeClock(),
        agents=lambda: agents,
        boxes=lambda: BOXES,
        config=config,
        **extra,  # type: ignore[arg-type]
    )


class Api:
    """The app over one usage service, its metrics attached as the daemon attaches them."""

    def __init__(self, usage: UsageService | None, max_request_bytes: int = 65536) -> None:
        self.metrics = Metrics()
        if usage is not None:
            self.metrics.usage.attach(usage.report)
        self.app = create_app(
            services(
                registry=self.metrics.registry,
                tokens=(SecretStr(TOKEN),),
                usage=usage,
                max_request_bytes=max_request_bytes,
            )
        )

    def calls(self, requests: list[tuple[str, str, bytes | None, dict[str, str]]]) -> list[httpx.Response]:
        async def go() -> list[httpx.Response]:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://warmer") as client:
                return [
                    await client.request(method, path, content=body, headers=headers)
                    for method, path, body, headers in requests
                ]

        return asyncio.run(go())

    def post(self, *bodies: bytes | str, headers: dict[str, str] = AUTH) -> list[httpx.Response]:
        return self.calls(
            [
                (
                    "POST",
                    "/v1/usage",
                    b if isinstance(b, bytes) else b.encode(),
                    {**headers, "content-type": "application/json"},
                )
                for b in bodies
            ]
        )

    def get(self, path: str = "/v1/usage", headers: dict[str, str] = AUTH) -> httpx.Response:
        return self.calls([("GET", path, None, headers)])[0]


def chat_usage(prompt: int, cached: int) -> dict[str, object]:
    """OpenAI Chat Completions usage (https://platform.openai.com/docs/api-reference/chat/object)."""
    return {"prompt_tokens": prompt, "prompt_tokens_details": {"cached_tokens": cached}}


def lines(path: Path = EXAMPLE_LOG) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()]


def gauges(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels))): s.value for s in parse_prometheus_text(text)}


def test_the_replayed_log_gives_the_clis_figures() -> None:
    api = Api(usage_service())
    answers = api.post(*lines())
    assert {a.status_code for a in answers} == {200}
    assert answers[-1].json() == {"accepted": True, "duplicate": False, "window_records": len(lines())}
    live = api.get()
    assert live.status_code == 200
    assert live.json() == report_of()


def test_the_turn1_gauges_say_what_get_usage_says() -> None:
    api = Api(usage_service())
    api.post(*lines())
    report = api.get().json()
    metrics = gauges(api.get("/metrics", headers={}).text)
    for agent in report["agents"]:
        labels = (("agent", agent["agent"]),)
        assert metrics[("warmer_agent_turn1_cache_hit_ratio", labels)] == pytest.approx(
            agent["turn1_hit_rate"]
        )
        assert metrics[("warmer_agent_prefix_depth_ratio", labels)] == pytest.approx(agent["depth"])
        assert metrics[("warmer_agent_turn1_coverage_ratio", labels)] == pytest.approx(agent["coverage"])
    assert metrics[("warmer_usage_window_records", ())] == len(lines())


def test_per_box_turn1_hit_rate_live_and_in_the_cli(tmp_path: Path) -> None:
    """Where first turns landed: one box warm, the other cold half the time."""
    records = []
    for i in range(8):
        box = BOXES[i % 2]
        cached = 3000 if box == "llama-1" or i % 4 == 1 else 0
        for turn in (1, 2):
            records.append(
                {
                    "call_id": f"c{i}",
                    "turn": turn,
                    "agent": "outbound-sales",
                    "box": box,
                    "usage": {
                        "prompt_tokens": 3400 * turn,
                        "prompt_tokens_details": {"cached_tokens": cached * turn},
                    },
                }
            )
    path = tmp_path / "boxes.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    api = Api(usage_service())
    api.post(*lines(path))
    live = api.get().json()
    assert live == report_of(path)
    by_box = {row["label"]: row for row in live["by_box"]}
    assert by_box["llama-1"]["hit_rate"] == pytest.approx(3000 / 3400)
    assert by_box["llama-2"]["hit_rate"] == pytest.approx(3000 * 2 / (3400 * 4))
    metrics = gauges(api.get("/metrics", headers={}).text)
    assert metrics[("warmer_box_turn1_cache_hit_ratio", (("box", "llama-2"),))] == pytest.approx(
        3000 * 2 / (3400 * 4)
    )


def test_depth_from_warmers_stable_prefix_matches_the_cli_with_the_config(tmp_path: Path) -> None:
    """A configured agent's depth is warmer's own stable share, live as in `warmer --config ... hitrate`."""
    agents = load_agent_specs(ROOT / "config" / "agents")
    prefixes = OfflineStablePrefixes(lambda: agents, load_profiles(ROOT / "models"))
    body = [
        {
            "call_id": f"c{i}",
            "turn": 1,
            "agent": "outbound-sales",
            "usage": {
                "prompt_tokens": 3372,
                "prompt_tokens_details": {"cached_tokens": 3072 if i % 3 else 0},
            },
        }
        for i in range(9)
    ]
    path = tmp_path / "configured.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in body))
    api = Api(usage_service(agents=tuple(agents), prefixes=prefixes))
    api.post(*lines(path))
    live = api.get().json()
    result = run("--config", str(ROOT / "config" / "example.toml"), "hitrate", "--calls", str(path), "--json")
    assert result.exit_code == 0, result.output
    assert live == json.loads(result.output)
    (agent,) = live["agents"]
    assert agent["depth_source"] == "config"
    assert agent["coverage"] == pytest.approx(6 / 9)


def test_a_resent_turn_replaces_it() -> None:
    api = Api(usage_service())
    first, again = ({"call_id": "a", "turn": 1, "usage": chat_usage(1000, cached)} for cached in (0, 900))
    answers = api.post(json.dumps(first), json.dumps(again))
    assert [a.json()["duplicate"] for a in answers] == [False, True]
    report = api.get().json()
    assert (report["records"], report["turn1"]["cached_tokens"]) == (1, 900)


def test_the_window_keeps_the_newest_records_within_its_bounds() -> None:
    clock = FakeClock()
    api = Api(usage_service(clock, config=UsageWindowConfig(max_records=3, max_age_seconds=60)))
    body = '{{"call_id": "{}", "turn": 1, "usage": {{"prompt_tokens": 100}}}}'
    api.post(*(body.format(c) for c in "abcd"))
    assert api.get().json()["calls"] == 3  # "a" left first
    clock.t += 61
    api.post(body.format("e"))
    assert api.get().json()["calls"] == 1
    clock.t += 61
    report = api.get().json()
    assert (report["records"], report["turn1"]["hit_rate"]) == (0, None)


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ('{"call_id": "a", "turn": 1, "usage": {"input_tokens": 10}}', 422, "usage.input_tokens"),
        ('{"call_id": "a", "turn": 0, "usage": {"prompt_tokens": 10}}', 422, "turn"),
        ('{"turn": 1, "usage": {"prompt_tokens": 10}}', 422, "call_id"),
        ("[1]", 422, "body"),
        ('{"call_id": "a", "turn": 1,', 400, "body"),
        ('{"call_id": "a", "turn": 1, "agent": "nobody", "usage": {"prompt_tokens": 10}}', 404, "agent"),
        ('{"call_id": "a", "turn": 1, "box": "gpu-9", "usage": {"prompt_tokens": 10}}', 404, "box"),
    ],
)
def test_bad_reports_are_refused_naming_the_field_and_change_nothing(
    body: str, status: int, field: str
) -> None:
    api = Api(usage_service())
    (answer,) = api.post(body)
    assert answer.status_code == status
    assert answer.json()["field"] == field
    assert api.get().json()["records"] == 0


def test_a_body_over_the_limit_is_413() -> None:
    api = Api(usage_service(), max_request_bytes=200)
    padding = "x" * 300
    (answer,) = api.post(
        f'{{"call_id": "a", "turn": 1, "note": "{padding}", "usage": {{"prompt_tokens": 10}}}}'
    )
    assert answer.status_code == 413
    assert api.get().json()["records"] == 0


def test_usage_needs_the_bearer_token() -> None:
    api = Api(usage_service())
    (answer,) = api.post(lines()[0], headers={})
    assert answer.status_code == 401
    assert api.get(headers={}).status_code == 401


def test_without_a_usage_service_both_answer_503() -> None:
    api = Api(None)
    (answer,) = api.post(lines()[0])
    assert answer.status_code == 503
    assert api.get().status_code == 503
    metrics = gauges(api.get("/metrics", headers={}).text)
    assert metrics[("warmer_usage_window_records", ())] == 0


def test_unknown_figures_are_nan_on_metrics() -> None:
    api = Api(usage_service())
    api.post('{"call_id": "a", "turn": 2, "agent": "outbound-sales", "usage": {"prompt_tokens": 100}}')
    metrics = gauges(api.get("/metrics", headers={}).text)
    assert math.isnan(metrics[("warmer_agent_turn1_cache_hit_ratio", (("agent", "outbound-sales"),))])


class NoStore:
    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None


def test_the_daemon_wires_usage_with_its_agents_boxes_and_stable_prefixes(tmp_path: Path) -> None:
    """The example config's daemon: a turn on a fleet box is recorded, depth is the agent's stable share."""
    loaded = load_config(ROOT / "config" / "example.toml")
    settings = loaded.settings.model_copy(update={"database": DatabaseSettings(state_dir=tmp_path)})
    agents = {k: v for k, v in loaded.agents.items() if isinstance(v, AgentSpec)}
    prefixes = OfflineStablePrefixes(lambda: agents, loaded.profiles)
    share = asyncio.run(prefixes.stable_share("outbound-sales"))

    async def scenario() -> tuple[httpx.Response, httpx.Response, str]:
        daemon = build(
            settings,
            profiles=loaded.profiles,
            agents=agents,
            store_factory=lambda _: NoStore(),  # type: ignore[arg-type,return-value]
            prepare=lambda _: None,
        )
        await daemon.open()
        body = {
            "call_id": "c-1",
            "turn": 1,
            "agent": "outbound-sales",
            "box": "llama-1",
            "usage": chat_usage(3372, 3114),
        }
        transport = httpx.ASGITransport(app=daemon.api)
        async with httpx.AsyncClient(transport=transport, base_url="http://warmer") as client:
            posted = await client.post("/v1/usage", json=body)
            report = await client.get("/v1/usage")
            text = (await client.get("/metrics")).text
        await daemon.close()
        return posted, report, text

    posted, report, text = asyncio.run(scenario())
    assert posted.status_code == 200, posted.text
    (agent,) = report.json()["agents"]
    assert (agent["depth_source"], agent["depth"]) == ("config", pytest.approx(share))
    metrics = gauges(text)
    assert metrics[("warmer_box_turn1_cache_hit_ratio", (("box", "llama-1"),))] == pytest.approx(3114 / 3372)
