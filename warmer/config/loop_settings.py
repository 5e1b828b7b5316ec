"""How the daemon works its fleet: `[reconcile]`, `[engines]`, `[retry]`, `[hitrate]`, `[capacity]`,
`[dialer]` and `[gate]`.

Size: one table per section with every setting's default and why, so each is documented once.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from warmer.config.section import Section
from warmer.core.capacity import (
    DEFAULT_PREFIX_BAND,
    DEFAULT_PREFIX_FLOOR,
    DEFAULT_PREFIX_HEADROOM,
    PrefixBudgetPolicy,
)
from warmer.core.gate import GateConfig
from warmer.core.model import EngineTimeouts, RetryPolicy


class ReconcileSettings(Section):
    interval_seconds: float = Field(
        default=5.0,
        gt=0,
        description=(
            "Seconds between reconcile passes (desired vs observed warm state). Short next to keepalive "
            "horizons (minutes), so a missing prefix is noticed within seconds, yet cheap: a pass is local."
        ),
    )
    health_poll_seconds: float = Field(
        default=5.0,
        gt=0,
        description=(
            "Seconds between engine health/epoch polls per box. A restart is caught within this bound, "
            "before the gateway sends real calls to a cold process."
        ),
    )
    stall_seconds: float = Field(
        default=120.0,
        gt=0,
        description=(
            "GET /healthz fails (503) when no reconcile pass has finished for this long, so a liveness probe "
            "restarts a daemon whose loop is wedged. A pass that ends on a database error still counts "
            "(the loop is alive; /readyz reports the database). Well above interval_seconds and the engine "
            "health timeout: a pass polls every box once."
        ),
    )
    health_slow_polls_allowed: int = Field(
        default=1,
        ge=0,
        description=(
            "Health polls in a row a ready box may answer later than engine.health_timeout_seconds and keep "
            "its routes (count). A busy engine on a saturated host answers late now and then; taking it out "
            "for one late answer shifts its calls onto the others and back a poll later. A refused "
            "connection, an error or a new epoch still takes the box out at once; 0 = any late answer does."
        ),
    )
    keepalive_jitter_fraction: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description=(
            "Random spread applied to each keepalive delay, as a fraction of it (0.1 = +/-10%). Spreads "
            "touches so many prefixes warmed together do not all come due in the same second."
        ),
    )
    max_concurrent_warms_per_box: int = Field(
        default=2,
        ge=1,
        description=(
            "Warm requests in flight per box at once (count). Two keeps warming from competing with real "
            "calls for the engine's batch while still overlapping network and prefill."
        ),
    )
    warm_budget_tokens_per_second: int = Field(
        default=8000,
        ge=1,
        description=(
            "Uncached (prefilled) warm tokens per second per box. Caps warming at a small share of a GPU's "
            "prefill throughput so warming never becomes the load."
        ),
    )
    fleet_warm_tokens_per_second: int = Field(
        default=0,
        ge=0,
        description=(
            "Uncached prompt tokens per second all warming together may spend across the fleet (restart "
            "warm-ups, warms, probes; pre-call warms go at once and pay it too). Work waits its turn, the "
            "most valuable first (calls/minute x prefix tokens of its agents; a restart warm-up is worth "
            "what its box holds), so a region restart ends with routes in order of call volume. 0 = derived: "
            "fleet_warm_share of each box's declared prefill_tokens_per_second summed, a box without one "
            "counting warm_budget_tokens_per_second."
        ),
    )
    fleet_warm_share: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description=(
            "Share (0..1] of each box's declared prefill rate the derived fleet warming budget counts. A "
            "quarter leaves the rest of the fleet's prefill to the calls a region restart moves onto it."
        ),
    )
    fleet_warm_max_in_flight: int = Field(
        default=64,
        ge=1,
        description=(
            "Restart warm-ups, warms and probes running at once across the fleet (count), whatever the "
            "token budget: bounds the daemon's own load and its database writes when many boxes restart."
        ),
    )
    fleet_warm_max_wait_seconds: float = Field(
        default=120.0,
        gt=0,
        description=(
            "Seconds a piece of warming may wait for the fleet budget before it goes ahead of more valuable "
            "work, oldest first: low-value work waits, it is never starved."
        ),
    )
    ramp_seconds: float = Field(
        default=60.0,
        ge=0,
        description=(
            "Seconds over which a newly ready box goes from `initial_ramp_weight` to full routing weight. "
            "A minute lets its hit rate and latency be seen on a small slice first; 0 disables ramping."
        ),
    )
    initial_ramp_weight: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="Routing weight (0..1] a box gets the moment it becomes ready: a small slice first.",
    )
    shutdown_grace_seconds: float = Field(
        default=10.0,
        gt=0,
        description=(
            "Seconds root tasks get to finish after SIGTERM/SIGINT before they are cancelled. 10 s fits "
            "inside Kubernetes' default 30 s termination grace and systemd's TimeoutStopSec."
        ),
    )
    retire_idle_after_seconds: float = Field(
        default=3600.0,
        ge=0,
        description=(
            "Seconds without traffic warmer sees for an agent (its pre-call asks and the route lookups "
            "they make, `POST /v1/prewarm`; a new agent counts from when it is first seen) after which its "
            "prefixes stop being kept warm on its boxes; campaigns and pre-call asks still warm it. Calls "
            "sent to the engines without asking warmer are not seen: book a campaign for such agents, or "
            "set 0. An hour spans a lunch break without paying keepalive touches all night. "
            "0 means never: keep every assigned agent warm forever."
        ),
    )

    def retire_idle_after(self) -> float | None:
        """The planner's idle cut-off: None (never retire) for 0, since TOML has no null to write."""
        return self.retire_idle_after_seconds or None

    @model_validator(mode="after")
    def _stall_above_a_pass(self) -> ReconcileSettings:
        # Below two intervals a healthy loop would be restarted between its passes.
        if self.stall_seconds < 2 * max(self.interval_seconds, self.health_poll_seconds):
            raise ValueError(
                "stall_seconds must be at least twice interval_seconds and health_poll_seconds "
                f"(a healthy loop passes every {max(self.interval_seconds, self.health_poll_seconds):g}s)"
            )
        return self


class EngineSettings(Section):
    connect_timeout_seconds: float = Field(
        default=2.0, gt=0, description="Seconds to open a TCP connection to an engine; loopback/LAN is fast."
    )
    health_timeout_seconds: float = Field(
        default=3.0,
        gt=0,
        description=(
            "Seconds a health/epoch call may take; a later answer counts as unhealthy once more of them "
            "in a row than reconcile.health_slow_polls_allowed."
        ),
    )
    request_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Seconds for one warm or probe request. A cold prefill of a long prefix on a busy engine can "
            "take many seconds; a minute catches hangs without failing honest work."
        ),
    )
    long_request_timeout_seconds: float = Field(
        default=300.0,
        gt=0,
        description=(
            "Seconds for restart warm-up requests (bursts, the very long prefill). The first sampled request "
            "after a restart may pay kernel compilation (~17 s seen on SGLang), so this is generous."
        ),
    )

    def timeouts(self) -> EngineTimeouts:
        return EngineTimeouts(
            connect=self.connect_timeout_seconds,
            health=self.health_timeout_seconds,
            request=self.request_timeout_seconds,
            long_request=self.long_request_timeout_seconds,
        )


class RetrySettings(Section):
    attempts: int = Field(
        default=3,
        ge=1,
        description="Total tries of a transient engine failure, including the first (count).",
    )
    initial_backoff_seconds: float = Field(
        default=0.2,
        ge=0,
        description="Seconds before the first retry; doubled per retry. Short: most blips are momentary.",
    )
    max_backoff_seconds: float = Field(
        default=2.0,
        ge=0,
        description="Cap on one backoff (seconds), so a retry never outlives a reconcile pass by much.",
    )
    jitter_seconds: float = Field(
        default=0.1,
        ge=0,
        description="Random seconds added to each backoff so retries across boxes do not synchronize.",
    )

    @model_validator(mode="after")
    def _cap_not_below_start(self) -> RetrySettings:
        if self.max_backoff_seconds < self.initial_backoff_seconds:
            raise ValueError("max_backoff_seconds must be >= initial_backoff_seconds")
        return self

    def policy(self) -> RetryPolicy:
        return RetryPolicy(
            attempts=self.attempts,
            initial_backoff_seconds=self.initial_backoff_seconds,
            max_backoff_seconds=self.max_backoff_seconds,
            jitter_seconds=self.jitter_seconds,
        )


class HitRateSettings(Section):
    poll_seconds: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Seconds between scrapes of each box's cache counters; the hit rate is computed over the "
            "traffic between two scrapes. A minute holds enough calls to judge, and one scrape per box "
            "per minute costs the engine nothing."
        ),
    )
    threshold: float = Field(
        default=0.90,
        ge=0,
        le=1,
        description=(
            "Hit ratio (0..1) below which a box alerts (metric and log event). 0.90 is the healthy bar "
            "seen in the field for agents whose long stable prefix is warm."
        ),
    )
    min_tokens_per_window: int = Field(
        default=10000,
        ge=0,
        description=(
            "Prompt tokens a box must have looked up between two scrapes before its ratio is judged, so an "
            "idle box with a few health checks or probes never alerts, and an alert clears once the box "
            "goes idle (about five calls' worth of prefix)."
        ),
    )


class UsageSettings(Section):
    window_records: int = Field(
        default=10_000,
        ge=1,
        le=1_000_000,
        description=(
            "Turn records `POST /v1/usage` keeps in memory for `GET /v1/usage` and the turn-1 gauges; the "
            "oldest leaves first. 10,000 is a few thousand calls: enough to judge an agent's first turns, "
            "and a few MB at most (every label a record carries is at most 200 characters)."
        ),
    )
    window_seconds: float = Field(
        default=3600.0,
        gt=0,
        description=(
            "Records older than this leave the window, so the figures follow what the dialer sends now "
            "(an hour spans a campaign's ramp without mixing yesterday in)."
        ),
    )


class CapacitySettings(Section):
    safe_fraction: float = Field(
        default=0.6,
        gt=0,
        le=1,
        description=(
            "Share of a box's prefill ceiling (uncached prompt tokens/s at full load) that `GET "
            "/v1/capacity` counts as its budget. 0.6: in the field, time to first token broke at about 60% "
            "of the ceiling, whatever mix of cached and uncached calls produced the load."
        ),
    )
    max_usage_age_seconds: float = Field(
        default=180.0,
        gt=0,
        description=(
            "A box's uncached-token window (from the hit-rate monitor's scrapes) older than this is not "
            "counted as its current use; keep it above `hitrate.poll_seconds`."
        ),
    )
    prefix_headroom_fraction: float = Field(
        default=DEFAULT_PREFIX_HEADROOM,
        ge=0,
        le=4,
        description=(
            "Growth allowed for the live calls' share of a box's KV pool (vLLM, SGLang) before the next "
            "capacity reading, as a fraction of it: the prefix budget is the pool less that share x (1 + "
            "this) less `prefix_floor_fraction`. 0.25: calls a quarter up on the last reading still fit "
            "without evicting a warm prefix."
        ),
    )
    prefix_floor_fraction: float = Field(
        default=DEFAULT_PREFIX_FLOOR,
        ge=0,
        lt=1,
        description=(
            "Share of a box's KV pool never given to prefixes, whatever the load reads (0..1). Covers a "
            "burst of new calls on an idle box between two readings."
        ),
    )
    prefix_band_fraction: float = Field(
        default=DEFAULT_PREFIX_BAND,
        ge=0,
        lt=1,
        description=(
            "Relative change of a box's prefix budget that is ignored (0..1): a new reading moves the budget "
            "in force only when it differs by more than this, so placement is not re-run for every small "
            "swing of load. 0.1 = 10%."
        ),
    )
    prefix_poll_seconds: float = Field(
        default=15.0,
        ge=0,
        description=(
            "Seconds between capacity readings of a healthy box (its KV pool and the share live calls "
            "hold), so its prefix budget follows load. 15 s follows a dialer ramp within a minute at one "
            "small request per box; 0 = read only when a new engine process is seen."
        ),
    )

    def prefix_budget(self) -> PrefixBudgetPolicy:
        return PrefixBudgetPolicy(
            headroom=self.prefix_headroom_fraction,
            floor=self.prefix_floor_fraction,
            band=self.prefix_band_fraction,
        )


class DialerSettings(Section):
    prewarm_max_wait_seconds: float = Field(
        default=10.0,
        ge=0,
        le=60,
        description=(
            "Longest a `POST /v1/prewarm` caller may wait for a warm (its `wait_ms` is capped to this). "
            "10 s covers a cold prefill of a long prefix on a busy box yet keeps a dialer worker from "
            "hanging on a box that will not warm."
        ),
    )
    campaign_lead_seconds: float = Field(
        default=300.0,
        ge=0,
        description=(
            "Seconds before a campaign's window opens that its agent's prefixes are warmed (and its group "
            "widened for its volume). Five minutes covers a restart warm-up plus prefix warms on a cold box."
        ),
    )
    precall_hold_seconds: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Seconds a pre-call ask (`POST /v1/prewarm`) keeps its agent at the top warm priority, ahead "
            "of campaigns and keepalives. 60 s outlasts the longest prewarm wait and the dial-and-ring "
            "time until the call's first turn, yet an ask with no call behind it stops jumping the queue "
            "within a minute."
        ),
    )
    precall_lend_seconds: float = Field(
        default=60.0,
        ge=0,
        description=(
            "Seconds a pre-call ask for an agent that no box keeps warm (more agents than the fleet holds) "
            "borrows room: its prefix is warmed at once in place of the least valuable prefix of one box "
            "(that prefix leaves the routes there first) and keeps the room this long, about a call. "
            "0: such asks are answered cold on a stand-in box."
        ),
    )
    precall_protect_seconds: float = Field(
        default=10.0,
        ge=0,
        description=(
            "Seconds after a pre-call answer during which the answered agent's prefix never leaves its box "
            "for another agent's just-in-time room (the call's first turn is on its way). 10 s covers "
            "dial-and-answer on most calls; longer keeps more prefixes from being lent, shorter risks a "
            "first turn that finds its prefix gone."
        ),
    )
    call_hold_seconds: float = Field(
        default=60.0,
        ge=0,
        description=(
            "Seconds a call keeps sending its turns to the engine slot its pre-call answer named (llama.cpp "
            "`id_slot`). Each of its turns overwrites that slot, so another prefix put there within this "
            "time is probed (one cached request) before an answer vouches for it. A minute covers a voice "
            "call of ~6 turns; 0 = never probe before answering."
        ),
    )
    volume_window_seconds: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Sliding window (seconds) over which pre-call asks are counted as an agent's observed call "
            "volume (calls/minute) for placement. A minute follows a dialer burst without flapping groups."
        ),
    )
    schedule_file: Path | None = Field(
        default=None,
        description=(
            "Optional JSON or TOML file listing campaigns (id, agent, starts_at, ends_at, expected_calls), "
            "synced into the store by id; campaigns booked through the API are never touched by it."
        ),
    )
    poll_seconds: float = Field(
        default=30.0,
        gt=0,
        description="Seconds between reads of `schedule_file`; well under any campaign lead time.",
    )


class GateSettings(Section):
    """The admission gate, `GET /v1/boxes/{id}/admit`: what an engine pod's readiness probe or a gateway's
    health check should ask. `/v1/boxes/{id}/ready` stays the plain truth; the gate fails safe."""

    max_hold_seconds: float = Field(
        default=300.0,
        ge=0,
        description=(
            "Longest a healthy box is held out of traffic while it warms, from its engine coming up "
            "(seconds). Five minutes covers a restart warm-up and the prefixes of a large box; a box that "
            "cannot verify in that time is let in with a warning, a gate_released event and the "
            "warmer_box_gate_released metric, rather than kept out for ever. 0 = never hold."
        ),
    )
    max_held_share: float = Field(
        default=0.5,
        ge=0,
        lt=1,
        description=(
            "Share of a model's (and of a box group's) healthy boxes that may be held out at once "
            "(0..1). At least one box of each is always let in, so a first deploy or a fleet restarting "
            "together comes back box by box instead of draining the whole Service; the boxes held "
            "longest are let in first. 0 = hold none (the gate is the engine's own health)."
        ),
    )

    def config(self) -> GateConfig:
        return GateConfig(max_hold_seconds=self.max_hold_seconds, max_held_share=self.max_held_share)
