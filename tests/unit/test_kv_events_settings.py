"""`[fleet.boxes.kv_events]` (vLLM, SGLang) and the SGLang box options, checked before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from warmer.config.settings import load_settings
from warmer.config.webhook_payloads import parse_deploy_event
from warmer.core.errors import ConfigError
from warmer.core.model import KvEventsEndpoint
from warmer.core.webhook import BoxUrlPolicy, InvalidEvent

BOX = """
[[fleet.boxes]]
id = "v1"
base_url = "http://127.0.0.1:8000"
engine = "{engine}"
model = "tiny"
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("WARMER_"):
            monkeypatch.delenv(name)


def load(tmp_path: Path, text: str) -> list[tuple[str, str]] | tuple[KvEventsEndpoint | None, ...]:
    path = tmp_path / "warmer.toml"
    path.write_text(text)
    try:
        settings = load_settings(path)
    except ConfigError as error:
        return error.problems
    return tuple(box.kv_events for box in settings.box_specs())


def test_a_vllm_box_names_its_publisher_and_replay_socket(tmp_path: Path) -> None:
    text = BOX.format(engine="vllm") + (
        "[fleet.boxes.kv_events]\nendpoint = 'tcp://10.0.0.5:5557'\nreplay_endpoint = 'tcp://10.0.0.5:5558'\n"
    )
    assert load(tmp_path, text) == (KvEventsEndpoint("tcp://10.0.0.5:5557", "tcp://10.0.0.5:5558", ""),)


def test_a_box_without_kv_events_has_none(tmp_path: Path) -> None:
    assert load(tmp_path, BOX.format(engine="vllm")) == (None,)


@pytest.mark.parametrize(
    ("kv_events", "path", "named"),
    [
        ("endpoint = 'tcp://*:5557'", "fleet.boxes[0].kv_events.endpoint", "tcp://host:port"),
        ("endpoint = 'http://h:5557'", "fleet.boxes[0].kv_events.endpoint", "tcp://host:port"),
        ("endpoint = 'tcp://h'", "fleet.boxes[0].kv_events.endpoint", "tcp://host:port"),
        (
            "endpoint = 'tcp://h:1'\nreplay_endpoint = 'tcp://h:port'",
            "fleet.boxes[0].kv_events.replay_endpoint",
            "tcp://host:port",
        ),
        ("endpoint = 'tcp://h:1'\nsocket = 'x'", "fleet.boxes[0].kv_events.socket", "Extra inputs"),
    ],
)
def test_a_bad_address_is_refused_by_field(tmp_path: Path, kv_events: str, path: str, named: str) -> None:
    problems = load(tmp_path, BOX.format(engine="vllm") + f"[fleet.boxes.kv_events]\n{kv_events}\n")
    assert isinstance(problems, list)
    assert [p for p, _ in problems] == [path]
    assert named in problems[0][1]


def test_kv_events_on_an_sglang_box_are_accepted_and_on_llamacpp_refused(tmp_path: Path) -> None:
    """SGLang publishes the same ZeroMQ KV events as vLLM (python/sglang/srt/disaggregation/kv_events.py
    @ 006d053f182f9b488d2bd841afa06d5f9120a258); llama-server publishes none."""
    events = "[fleet.boxes.kv_events]\nendpoint = 'tcp://h:1'\n"
    assert load(tmp_path, BOX.format(engine="sglang") + events) == (KvEventsEndpoint("tcp://h:1"),)
    problems = load(tmp_path, BOX.format(engine="llamacpp") + events)
    assert isinstance(problems, list)
    assert len(problems) == 1
    assert problems[0][0].startswith("fleet.boxes[0]")
    assert "vllm and sglang boxes only" in problems[0][1]


def test_an_ipc_address_is_accepted(tmp_path: Path) -> None:
    text = BOX.format(engine="vllm") + "[fleet.boxes.kv_events]\nendpoint = 'ipc:///run/vllm/kv'\n"
    assert load(tmp_path, text) == (KvEventsEndpoint("ipc:///run/vllm/kv"),)


def test_a_box_added_by_a_deploy_event_may_not_name_event_sockets() -> None:
    # The event's base_url must pass the allowlist; a ZMQ address would be a connection it does not cover.
    body = {
        "kind": "box.added",
        "id": "add-1",
        "occurred_at": 1700000000,
        "box": {
            "id": "v9",
            "base_url": "http://10.0.9.3:8000",
            "engine": "vllm",
            "model": "tiny",
            "kv_events": {"endpoint": "tcp://10.0.9.3:5557"},
        },
    }
    with pytest.raises(InvalidEvent) as caught:
        parse_deploy_event(json.dumps(body), box_url_policy=BoxUrlPolicy(("http://10.0.9.*:8000",)))
    assert [path for path, _ in caught.value.problems] == ["box.kv_events"]
    assert "config file only" in caught.value.problems[0][1]


def test_sglang_warm_tier_and_priority_reach_the_box_and_are_refused_elsewhere(tmp_path: Path) -> None:
    path = tmp_path / "warmer.toml"
    path.write_text(BOX.format(engine="sglang") + "warm_tier = 'host'\nwarm_priority = 7\n")
    (spec,) = load_settings(path).box_specs()
    assert (spec.warm_tier, spec.warm_priority) == ("host", 7)
    for option in ("warm_tier = 'host'", "warm_priority = 7"):
        problems = load(tmp_path, BOX.format(engine="vllm") + option + "\n")
        assert isinstance(problems, list)
        assert len(problems) == 1
        assert f"{option.split()[0]} applies to sglang boxes only" in problems[0][1]
    bad = load(tmp_path, BOX.format(engine="sglang") + "warm_tier = 'disk'\n")
    assert isinstance(bad, list)
    assert [p for p, _ in bad] == ["fleet.boxes[0].warm_tier"]


def test_a_hash_seed_reaches_a_vllm_box_and_is_refused_on_sglang(tmp_path: Path) -> None:
    events = "[fleet.boxes.kv_events]\nendpoint = 'tcp://h:1'\nhash_seed = '42'\n"
    assert load(tmp_path, BOX.format(engine="vllm") + events) == (
        KvEventsEndpoint("tcp://h:1", hash_seed="42"),
    )
    problems = load(tmp_path, BOX.format(engine="sglang") + events)
    assert isinstance(problems, list)
    assert "hash_seed reproduces vLLM's block hashes" in problems[0][1]


def test_a_box_added_by_a_deploy_event_keeps_its_sglang_options() -> None:
    body = {
        "kind": "box.added",
        "id": "add-2",
        "occurred_at": 1700000000,
        "box": {
            "id": "s9",
            "base_url": "http://10.0.9.3:8000",
            "engine": "sglang",
            "model": "tiny",
            "warm_tier": "host",
            "warm_priority": 3,
        },
    }
    event = parse_deploy_event(json.dumps(body), box_url_policy=BoxUrlPolicy(("http://10.0.9.*:8000",)))
    spec = event.box_spec()  # type: ignore[union-attr]
    assert (spec.warm_tier, spec.warm_priority) == ("host", 3)
