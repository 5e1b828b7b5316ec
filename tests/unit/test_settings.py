"""Settings: TOML file + WARMER_* env (env wins), secrets masked, paths anchored at the config file."""

from __future__ import annotations

from pathlib import Path

import pytest

from warmer.config.settings import (
    Settings,
    field_path,
    load_settings,
)
from warmer.core.errors import ConfigError
from warmer.core.model import EngineKind, EngineTimeouts, ModelProfile, RetryPolicy

CONFIG = """
[database]
state_dir = "state"

[api]
port = 9100
tokens = ["file-token-1234"]
webhook_secret = "file-webhook-secret"

[engines]
request_timeout_seconds = 12.5

[retry]
attempts = 5
max_backoff_seconds = 4.0

[fleet]
models_dir = "profiles"
agents_dir = "agents"

[[fleet.boxes]]
id = "a"
base_url = "http://127.0.0.1:8091/"
engine = "llamacpp"
model = "tiny"

[[fleet.boxes]]
id = "b"
base_url = "http://127.0.0.1:8092"
engine = "llamacpp"
model = "tiny"
slots = 4
group = "g1"
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests see only the WARMER_* variables they set themselves."""
    import os

    for name in list(os.environ):
        if name.startswith("WARMER_"):
            monkeypatch.delenv(name)


def write_config(tmp_path: Path, text: str = CONFIG) -> Path:
    path = tmp_path / "conf" / "warmer.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_file_values_are_read_and_relative_paths_anchor_at_the_file(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    settings = load_settings(path)
    assert settings.api.port == 9100
    assert settings.engines.request_timeout_seconds == 12.5
    assert settings.database.state_dir == path.parent / "state"
    assert settings.fleet.models_dir == path.parent / "profiles"
    assert settings.fleet.agents_dir == path.parent / "agents"
    assert settings.fleet.boxes[0].base_url == "http://127.0.0.1:8091"  # trailing slash dropped
    # Untouched sections keep their defaults.
    assert settings.reconcile.shutdown_grace_seconds == Settings().reconcile.shutdown_grace_seconds


def test_environment_wins_over_the_file_and_merges_nested(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_config(tmp_path)
    monkeypatch.setenv("WARMER_API__PORT", "9200")
    monkeypatch.setenv("WARMER_RETRY__ATTEMPTS", "7")
    monkeypatch.setenv("WARMER_DATABASE__URL", "postgresql+psycopg://warmer:pw-from-env@db/warmer")
    settings = load_settings(path)
    assert settings.api.port == 9200
    assert settings.retry.attempts == 7
    # Siblings of an overridden field still come from the file.
    assert settings.api.tokens[0].get_secret_value() == "file-token-1234"
    assert settings.retry.max_backoff_seconds == 4.0
    assert not settings.database.is_embedded
    assert settings.database_url() == "postgresql+psycopg://warmer:pw-from-env@db/warmer"


def test_config_path_comes_from_warmer_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMER_CONFIG", str(write_config(tmp_path)))
    assert load_settings().api.port == 9100


def test_empty_database_url_means_embedded_sqlite_in_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WARMER_DATABASE__URL", "")
    settings = load_settings(write_config(tmp_path))
    assert settings.database.is_embedded
    expected = tmp_path / "conf" / "state" / "warmer.db"
    assert settings.database_url() == f"sqlite:///{expected}"


def test_core_values_come_out_of_the_settings(tmp_path: Path) -> None:
    settings = load_settings(write_config(tmp_path))
    assert settings.engine_timeouts() == EngineTimeouts(
        connect=2.0, health=3.0, request=12.5, long_request=300.0
    )
    assert settings.retry_policy() == RetryPolicy(
        attempts=5, initial_backoff_seconds=0.2, max_backoff_seconds=4.0, jitter_seconds=0.1
    )
    profile = ModelProfile(name="tiny", engine=EngineKind.LLAMACPP, slots=2)
    a, b = settings.box_specs({"tiny": profile})
    assert (a.id, a.engine, a.slots, a.base_url) == ("a", EngineKind.LLAMACPP, 2, "http://127.0.0.1:8091")
    assert (b.id, b.slots, b.group) == ("b", 4, "g1")  # an explicit slot count beats the profile's


def test_secrets_never_show_in_repr_str_or_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMER_DATABASE__URL", "postgresql+psycopg://warmer:db-password-9876@db/warmer")
    settings = load_settings(write_config(tmp_path))
    for text in (repr(settings), str(settings), settings.model_dump_json(), repr(settings.api)):
        assert "file-token-1234" not in text
        assert "file-webhook-secret" not in text
        assert "db-password-9876" not in text


@pytest.mark.parametrize(
    ("snippet", "path"),
    [
        ("[api]\nport = 70000\n", "api.port"),
        ("[api]\ncolour = 'blue'\n", "api.colour"),
        ("[mystery]\nx = 1\n", "mystery"),
        ("[logging]\nformat = 'xml'\n", "logging.format"),
        ("[reconcile]\nkeepalive_jitter_fraction = 1.5\n", "reconcile.keepalive_jitter_fraction"),
        ("[retry]\ninitial_backoff_seconds = 3.0\nmax_backoff_seconds = 1.0\n", "retry"),
        (
            "[[fleet.boxes]]\nid='a'\nbase_url='http://h:1'\nengine='llamacpp'\nmodel='m'\n"
            "[[fleet.boxes]]\nid='b'\nbase_url='h:2'\nengine='tgi'\nmodel='m'\nslots=0\n",
            "fleet.boxes[1].engine",
        ),
    ],
)
def test_invalid_values_are_reported_by_field_path(tmp_path: Path, snippet: str, path: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write_config(tmp_path, snippet))
    assert path in [problem_path for problem_path, _ in caught.value.problems]


def test_every_box_field_error_is_reported_at_once(tmp_path: Path) -> None:
    text = "[[fleet.boxes]]\nid='bad id'\nbase_url='ftp://h'\nengine='tgi'\nmodel='m'\nslots=0\n"
    with pytest.raises(ConfigError) as caught:
        load_settings(write_config(tmp_path, text))
    paths = {path for path, _ in caught.value.problems}
    assert paths == {
        "fleet.boxes[0].id",
        "fleet.boxes[0].base_url",
        "fleet.boxes[0].engine",
        "fleet.boxes[0].slots",
    }


def test_invalid_environment_values_are_reported_by_field_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WARMER_API__PORT", "not-a-port")
    with pytest.raises(ConfigError) as caught:
        load_settings(write_config(tmp_path))
    assert [path for path, _ in caught.value.problems] == ["api.port"]


def test_unreadable_or_broken_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_settings(write_config(tmp_path, "[api\nport = 1"))


def test_field_path_formats_list_indexes() -> None:
    assert field_path(("fleet", "boxes", 1, "engine")) == "fleet.boxes[1].engine"
    assert field_path(()) == "(root)"
