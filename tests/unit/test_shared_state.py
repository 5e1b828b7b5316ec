"""Shared deploy state (warmer.core.shared_state) and a box's restart warm-up as the store shows it."""

from __future__ import annotations

import pytest

from warmer.core.model import BoxSpec, CacheTier, EngineKind, PhaseName, PhaseRecord
from warmer.core.planner import WarmupStatus
from warmer.core.shared_state import (
    FleetChange,
    RolloutMark,
    SharedFleetState,
    box_from_data,
    box_to_data,
)
from warmer.service.replicas.shared_view import warmup_from_phases

A = BoxSpec(id="a", base_url="http://127.0.0.1:9001", engine=EngineKind.LLAMACPP, model="tiny", slots=2)
B = BoxSpec(id="b", base_url="http://127.0.0.1:9002", engine=EngineKind.VLLM, model="tiny", group="g")
C = BoxSpec(
    id="c",
    base_url="http://127.0.0.1:9003",
    engine=EngineKind.SGLANG,
    model="tiny",
    cache_capacity_tokens=9,
    warm_tier=CacheTier.HOST,
    warm_priority=5,
)


def test_the_fleet_is_configured_minus_removed_plus_added() -> None:
    state = SharedFleetState(
        changes={
            "b": FleetChange("b", None, "ev-1", 1.0),
            "c": FleetChange("c", C, "ev-2", 2.0),
        }
    )
    assert state.fleet([A, B]) == [A, C]


def test_an_added_spec_replaces_the_configured_one() -> None:
    moved = BoxSpec(id="a", base_url="http://127.0.0.1:9999", engine=EngineKind.LLAMACPP, model="tiny")
    state = SharedFleetState(changes={"a": FleetChange("a", moved, "ev", 1.0)})
    assert state.fleet([A, B]) == [moved, B]


def test_drains_and_tags_come_from_the_rollout_marks() -> None:
    state = SharedFleetState(
        rollouts={
            "a": RolloutMark("a", "rollout in progress", "rollout-old", "ev-1", 1.0),
            "b": RolloutMark("b", None, "rollout-new", "ev-2", 2.0),
        }
    )
    assert state.drains() == {"a": "rollout in progress"}
    assert state.epoch_tags() == {"a": "rollout-old", "b": "rollout-new"}


@pytest.mark.parametrize("box", [A, B, C])
def test_a_box_spec_round_trips_through_its_data(box: BoxSpec) -> None:
    assert box_from_data(box_to_data(box)) == box


def test_a_malformed_box_row_names_the_field() -> None:
    data = box_to_data(A) | {"slots": "two"}
    with pytest.raises(ValueError, match="slots"):
        box_from_data(data)
    with pytest.raises(ValueError, match="base_url"):
        box_from_data(box_to_data(A) | {"base_url": None})


def phase(name: PhaseName, *, ok: bool | None = True, finished: float | None = 2.0) -> PhaseRecord:
    return PhaseRecord(box_id="a", epoch="e", phase=name, started_at=1.0, finished_at=finished, ok=ok)


def test_stored_warmup_is_done_once_prefixes_started() -> None:
    assert warmup_from_phases([]).status is WarmupStatus.NOT_STARTED
    part_way = [phase(PhaseName.SAMPLED), phase(PhaseName.CONSTRAINED)]
    assert warmup_from_phases(part_way).status is WarmupStatus.NOT_STARTED
    done = warmup_from_phases([*part_way, phase(PhaseName.PREFIXES, ok=None, finished=None)])
    assert done.status is WarmupStatus.DONE
    assert done.finished_at == 1.0
    assert done.prefixes_open


def test_stored_warmup_failed_names_the_error() -> None:
    failed = PhaseRecord(
        box_id="a", epoch="e", phase=PhaseName.BURST, started_at=1.0, finished_at=3.0, ok=False, error="boom"
    )
    seen = warmup_from_phases([phase(PhaseName.SAMPLED), failed])
    assert seen.status is WarmupStatus.FAILED
    assert seen.error == "boom"
    assert seen.finished_at == 3.0
