"""`[replicas]`: lease timing that survives one late heartbeat, and a replica id that is a real name."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from warmer.config.server_settings import ReplicaSettings
from warmer.config.settings import Settings
from warmer.root.replicas import lease_config


def test_defaults_give_the_documented_takeover_bound() -> None:
    config = lease_config(Settings())
    assert (config.lease_seconds, config.renew_seconds, config.takeover_bound_seconds) == (15.0, 5.0, 20.0)


def test_a_lease_shorter_than_two_heartbeats_is_refused_naming_both() -> None:
    with pytest.raises(
        ValidationError, match=r"lease_seconds \(9\) must be at least twice renew_seconds \(5\)"
    ):
        ReplicaSettings(lease_seconds=9.0, renew_seconds=5.0)


@pytest.mark.parametrize("field", ["lease_seconds", "renew_seconds"])
def test_non_positive_timings_are_refused(field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        ReplicaSettings(**{field: 0.0})


def test_an_empty_replica_id_is_refused() -> None:
    with pytest.raises(ValidationError, match="replica_id"):
        ReplicaSettings(replica_id="")
