"""Deploy webhook signatures, payload validation, and the `warmer sign-webhook` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from warmer.cli.webhook import sign_webhook
from warmer.config.webhook_payloads import (
    AgentPromptChanged,
    BoxAdded,
    BoxRemoved,
    RolloutFinished,
    RolloutStarted,
    parse_deploy_event,
    unknown_box_ids,
)
from warmer.core.model import EngineKind
from warmer.core.webhook import (
    SIGNATURE_HEADER,
    BoxUrlPolicy,
    InvalidEvent,
    SignatureOutcome,
    normalize_box_url,
    sign_body,
    verify_signature,
)

SECRET = "s3cret-current"
OLD_SECRET = "s3cret-previous"
NOW = 1_750_000_000
BODY = b'{"kind":"rollout.started","id":"evt-1","occurred_at":"2025-06-15T15:06:40Z","box_ids":["gpu-1"]}'


def verify(
    body: bytes, header: str | None, secrets: list[str] | None = None, now: float = NOW
) -> SignatureOutcome:
    return verify_signature(body, header, secrets or [SECRET], now=now, tolerance_seconds=300).outcome


# ------------------------------------------------------------------------------------------ signatures


def test_good_signature_is_accepted() -> None:
    header = sign_body(BODY, SECRET, NOW)
    check = verify_signature(BODY, header, [SECRET], now=NOW + 10)
    assert check.ok
    assert check.timestamp == NOW


def test_forged_signature_is_rejected() -> None:
    assert verify(BODY, sign_body(BODY, "guessed-secret", NOW)) is SignatureOutcome.BAD_SIGNATURE


def test_tampered_body_is_rejected() -> None:
    header = sign_body(BODY, SECRET, NOW)
    tampered = BODY.replace(b"gpu-1", b"gpu-2")
    assert verify(tampered, header) is SignatureOutcome.BAD_SIGNATURE


def test_stale_and_future_timestamps_are_rejected() -> None:
    header = sign_body(BODY, SECRET, NOW)
    assert verify(BODY, header, now=NOW + 301) is SignatureOutcome.STALE
    assert verify(BODY, header, now=NOW - 301) is SignatureOutcome.STALE
    assert verify(BODY, header, now=NOW + 299) is SignatureOutcome.OK


def test_replay_with_a_fresh_timestamp_is_rejected() -> None:
    """A captured request re-sent later with `t=` rewritten to now: t is signed, so it fails."""
    old = sign_body(BODY, SECRET, NOW - 3600)
    signature = old.split(",")[1]
    replayed = f"t={NOW},{signature}"
    assert verify(BODY, old) is SignatureOutcome.STALE
    assert verify(BODY, replayed) is SignatureOutcome.BAD_SIGNATURE


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "v1=" + "a" * 64,  # no timestamp
        f"t={NOW}",  # no signature
        f"t=yesterday,v1={'a' * 64}",
        f"t={NOW},v1=nothex",
        f"t={NOW},t={NOW},v1={'a' * 64}",
        "garbage",
        f"t={NOW},v1={'a' * 64}," + "x" * 5000,
    ],
)
def test_malformed_header(header: str | None) -> None:
    assert verify(BODY, header) is SignatureOutcome.MALFORMED_HEADER


def test_unknown_schemes_are_ignored_but_v1_is_required() -> None:
    header = sign_body(BODY, SECRET, NOW) + ",v0=deadbeef"
    assert verify(BODY, header) is SignatureOutcome.OK


def test_rotation_receiver_holds_old_and_new_secrets() -> None:
    signed_with_old = sign_body(BODY, OLD_SECRET, NOW)
    assert verify(BODY, signed_with_old, [SECRET, OLD_SECRET]) is SignatureOutcome.OK
    assert verify(BODY, signed_with_old, [SECRET]) is SignatureOutcome.BAD_SIGNATURE


def test_rotation_sender_signs_with_both_secrets() -> None:
    header = sign_body(BODY, [SECRET, OLD_SECRET], NOW)
    assert header.count("v1=") == 2
    assert verify(BODY, header, [OLD_SECRET]) is SignatureOutcome.OK
    assert verify(BODY, header, [SECRET]) is SignatureOutcome.OK


def test_no_secret_configured_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="secret"):
        verify_signature(BODY, sign_body(BODY, SECRET, NOW), [""], now=NOW)
    with pytest.raises(ValueError, match="secret"):
        sign_body(BODY, [], NOW)


# ------------------------------------------------------------------------------------------ payloads

ALLOW_POOL = BoxUrlPolicy(("http://10.0.3.*:30000", "http://*.gpu.internal:8000"))


def event(kind: str, **fields: object) -> bytes:
    return json.dumps({"kind": kind, "id": "evt-9", "occurred_at": "2025-06-15T15:06:40Z", **fields}).encode()


def problems(body: bytes, policy: BoxUrlPolicy | None = None) -> list[tuple[str, str]]:
    with pytest.raises(InvalidEvent) as caught:
        parse_deploy_event(body, box_url_policy=policy)
    return caught.value.problems


def test_each_kind_parses() -> None:
    changed = parse_deploy_event(event("agent.prompt_changed", agent_id="sales", spec={"blocks": ["hi"]}))
    assert isinstance(changed, AgentPromptChanged)
    assert changed.spec == {"blocks": ["hi"]}
    assert changed.occurred_at_unix == 1_750_000_000.0
    started = parse_deploy_event(event("rollout.started", box_ids=["gpu-1", "gpu-2"]))
    assert isinstance(started, RolloutStarted)
    assert started.box_ids == ["gpu-1", "gpu-2"]
    assert isinstance(parse_deploy_event(event("rollout.finished", box_ids=["gpu-1"])), RolloutFinished)
    removed = parse_deploy_event(event("box.removed", box_id="gpu-2"))
    assert isinstance(removed, BoxRemoved)
    box = {"id": "gpu-9", "base_url": "http://10.0.3.9:30000", "engine": "sglang", "model": "llama-8b"}
    added = parse_deploy_event(event("box.added", box=box), box_url_policy=ALLOW_POOL)
    assert isinstance(added, BoxAdded)
    spec = added.box_spec(default_slots=8)
    assert (spec.id, spec.base_url, spec.engine, spec.slots) == (
        "gpu-9",
        "http://10.0.3.9:30000",
        EngineKind.SGLANG,
        8,
    )


def test_unix_seconds_are_accepted_for_occurred_at() -> None:
    body = json.dumps(
        {"kind": "box.removed", "id": "e", "occurred_at": 1_750_000_000, "box_id": "b"}
    ).encode()
    assert parse_deploy_event(body).occurred_at_unix == 1_750_000_000.0


def test_validation_errors_name_the_fields() -> None:
    found = problems(event("rollout.started", box_ids=["gpu-1", "gpu-1", "bad id!"], extra=1))
    paths = [path for path, _ in found]
    assert "box_ids[2]" in paths
    assert "extra" in paths
    found = problems(event("rollout.finished", box_ids=[]))
    assert found[0][0] == "box_ids"
    found = problems(event("rollout.started", box_ids=["gpu-1", "gpu-1"]))
    assert found == [("box_ids", "box ids repeat: gpu-1")]
    found = problems(event("agent.prompt_changed", agent_id="", spec={}))
    assert {path for path, _ in found} == {"agent_id", "spec"}
    found = problems(json.dumps({"kind": "box.removed", "occurred_at": "2025-06-15T15:06:40"}).encode())
    assert {path for path, _ in found} == {"id", "occurred_at", "box_id"}


def test_unknown_kind_and_bad_bodies() -> None:
    assert problems(event("box.exploded"))[0][0] == "kind"
    assert problems(b"{not json")[0][0] == "(body)"
    assert problems(b"[1, 2]") == [("(body)", "must be a JSON object")]


def test_box_added_outside_the_allowlist_is_rejected() -> None:
    def box(url: str) -> bytes:
        return event("box.added", box={"id": "x", "base_url": url, "engine": "vllm", "model": "m"})

    for url in (
        "http://169.254.169.254:30000",  # cloud metadata
        "http://10.0.4.9:30000",  # wrong subnet
        "http://10.0.3.9:30001",  # wrong port
        "http://10.0.3.9:30000@evil.example",  # userinfo trick
        "http://user@10.0.3.9:30000",
        "http://10.0.3.9:30000/?next=http://evil",
        "http://evil.example#.gpu.internal:8000",
        "file:///etc/passwd",
    ):
        found = problems(box(url), ALLOW_POOL)
        assert [path for path, _ in found] == ["box.base_url"], url
    assert parse_deploy_event(box("http://a7.gpu.internal:8000"), box_url_policy=ALLOW_POOL)


def test_box_added_without_a_policy_is_always_rejected() -> None:
    body = event(
        "box.added", box={"id": "x", "base_url": "http://10.0.3.9:30000", "engine": "vllm", "model": "m"}
    )
    found = problems(body)
    assert found[0][0] == "box.base_url"
    assert "no box URL patterns" in found[0][1]


def test_normalized_urls() -> None:
    assert normalize_box_url("HTTP://Box-1.GPU.internal/") == "http://box-1.gpu.internal:80"
    assert normalize_box_url("https://10.0.0.1") == "https://10.0.0.1:443"
    assert normalize_box_url("http://[::1]:8000/sglang/") == "http://[::1]:8000/sglang"
    for bad, reason in (
        ("http://:80", "no host"),
        ("http://h:99999", "port"),
        ("ftp://h", "scheme"),
        ("http://h/a/../b", "'..'"),
        ("http://bad_host:1", "not a valid host"),
    ):
        with pytest.raises(ValueError, match=reason):
            normalize_box_url(bad)


def test_events_must_name_registered_boxes() -> None:
    rollout = parse_deploy_event(event("rollout.started", box_ids=["gpu-1", "gpu-7"]))
    assert unknown_box_ids(rollout, {"gpu-1", "gpu-2"}) == [("box_ids[1]", "unknown box 'gpu-7'")]
    removed = parse_deploy_event(event("box.removed", box_id="gpu-7"))
    assert unknown_box_ids(removed, {"gpu-1"}) == [("box_id", "unknown box 'gpu-7'")]
    added = parse_deploy_event(
        event(
            "box.added",
            box={"id": "gpu-1", "base_url": "http://10.0.3.1:30000", "engine": "vllm", "model": "m"},
        ),
        box_url_policy=ALLOW_POOL,
    )
    assert unknown_box_ids(added, {"gpu-1"}) == [("box.id", "box 'gpu-1' is already registered")]
    assert unknown_box_ids(rollout, {"gpu-1", "gpu-7"}) == []


# ------------------------------------------------------------------------------------------ the CLI


def test_sign_webhook_cli_output_verifies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    body_file = tmp_path / "event.json"
    body_file.write_bytes(BODY)
    monkeypatch.setenv("WARMER_WEBHOOK_SECRET", SECRET)
    result = CliRunner().invoke(sign_webhook, [str(body_file), "--timestamp", str(NOW)])
    assert result.exit_code == 0, result.output
    name, _, value = result.output.strip().partition(": ")
    assert name == SIGNATURE_HEADER
    assert verify(BODY, value) is SignatureOutcome.OK
    only = CliRunner().invoke(sign_webhook, [str(body_file), "--timestamp", str(NOW), "--value-only"])
    assert only.output.strip() == value


def test_sign_webhook_cli_rotation_and_missing_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body_file = tmp_path / "event.json"
    body_file.write_bytes(BODY)
    monkeypatch.delenv("WARMER_WEBHOOK_SECRET", raising=False)
    missing = CliRunner().invoke(sign_webhook, [str(body_file)])
    assert missing.exit_code == 2
    assert "WARMER_WEBHOOK_SECRET" in missing.output
    monkeypatch.setenv("WARMER_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("OLD_SECRET", OLD_SECRET)
    both = CliRunner().invoke(
        sign_webhook, [str(body_file), "--also-secret-env", "OLD_SECRET", "--value-only"]
    )
    value = both.output.strip()
    assert verify_signature(BODY, value, [OLD_SECRET], now=float(value.split(",")[0][2:])).ok


def test_settings_give_the_secrets_and_the_box_url_policy() -> None:
    from warmer.config.settings import Settings

    api = Settings(
        api={
            "webhook_secret": SECRET,
            "webhook_previous_secrets": [OLD_SECRET],
            "webhook_box_url_patterns": ["http://10.0.3.*:30000"],
        }
    ).api
    assert api.webhook_secrets() == [SECRET, OLD_SECRET]
    assert SECRET not in repr(api)
    signed_with_old = sign_body(BODY, OLD_SECRET, NOW)
    assert verify_signature(BODY, signed_with_old, api.webhook_secrets(), now=NOW).ok
    box = {"id": "x", "base_url": "http://10.0.3.9:30000", "engine": "vllm", "model": "m"}
    assert parse_deploy_event(event("box.added", box=box), box_url_policy=api.box_url_policy())
    assert Settings().api.webhook_secrets() == []
    assert Settings().api.box_url_policy() == BoxUrlPolicy()
