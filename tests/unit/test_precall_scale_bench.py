"""The many-agent pre-call bench's pure pieces: the agents it generates, the wrk script asking for them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.precall_scale import (
    AGENTS_PER_BOX,
    TOKENS_PER_PREFIX,
    agent_id,
    prefix_capacity,
    write_agents,
    wrk_script,
)
from warmer.config.agents import load_agent_specs
from warmer.config.profiles import load_profile
from warmer.config.tokenizer import offline_renderer, offline_tokenizer
from warmer.core.prefix import compute_stable_prefix

REPO = Path(__file__).resolve().parents[2]


def test_generated_agents_load_each_with_its_own_prefix_that_fits_its_room(tmp_path: Path) -> None:
    ids = write_agents(tmp_path, 120)
    specs = load_agent_specs(tmp_path)
    assert sorted(specs) == sorted(ids) == [agent_id(i) for i in range(120)]
    profile = load_profile(REPO / "models" / "tiny-demo.toml")
    render, tokenize = offline_renderer(profile), offline_tokenizer(profile)
    prefixes = {a: compute_stable_prefix(spec, render, tokenize) for a, spec in specs.items()}
    assert len({p.hash for p in prefixes.values()}) == 120  # no two agents share a prefix
    assert max(p.token_count for p in prefixes.values()) <= TOKENS_PER_PREFIX


def test_the_wrk_script_asks_for_the_generated_agents_with_a_fresh_call_id_each() -> None:
    script = wrk_script(2000)
    assert "local count = 2000" in script
    assert "math.random(0, count - 1)" in script  # agents 0..count-1, as write_agents names them
    fmt = re.search(r'string\.format\("([^"]+)", math\.random', script)
    assert fmt is not None
    assert fmt.group(1) % 1999 == agent_id(1999)
    assert "tostring(counter)" in script  # one call id per ask: the tag, then the ask's number
    assert "counter = counter + 1" in script
    assert "Bearer bench-token" in script
    assert "done = function" in script
    with pytest.raises(ValueError, match="count must be >= 1"):
        wrk_script(0)


def test_prefix_capacity_holds_two_boxes_per_agent_with_room() -> None:
    assert prefix_capacity(2000, 500) == 14  # 8 prefixes each on average at the placement's cap
    assert prefix_capacity(2000, 500) > 2 * 2000 / 500
    assert AGENTS_PER_BOX == 8


def test_loop_lag_over_a_load_is_the_histogram_difference() -> None:
    """Timers later than a bound are the timers of the window minus those in the bound's bucket."""
    from bench.precall_scale import LAG_BOUNDS, loop_lag_between

    before = {"0.02": 90.0, "0.05": 95.0, "0.1": 98.0, "0.25": 100.0, "+Inf": 100.0}
    after = {"0.02": 180.0, "0.05": 192.0, "0.1": 197.0, "0.25": 199.0, "+Inf": 200.0}
    lag = loop_lag_between(before, after)
    assert lag.timers == 100
    assert [lag.late_over[b] for b in LAG_BOUNDS] == [10, 3, 1, 1]
