"""A generated call log with a known answer: three agents of a team on hosted APIs, one record per LLM turn.

* `outbound-sales` (outbound, OpenAI Chat Completions usage): a DEPTH problem. A per-call value sits just
  past token 1,024 of its 7,200-token prompt, so every warm first turn caches exactly the provider's
  1,024-token floor (the field report's spike); 18 of its 20 first turns reach a warm cache.
* `outbound-renewals` (outbound, OpenAI Responses usage): a COVERAGE problem. 5,376 of its 6,000 turn-1
  tokens are stable, but only 6 of its 20 first turns reach a cache holding them.
* `inbound-support` (inbound, Anthropic Messages usage, whose `input_tokens` leaves cached tokens out):
  healthy, 4,500 of 5,000 stable and 18 of 20 first turns warm.

Later turns reuse their own call's previous turn (OpenAI in 128-token steps, Anthropic whole), so the
outbound/inbound gap is a turn-1 gap. Every figure follows from the constants below: the tests derive what
the report must say from them. `examples/call-usage.jsonl` is this log (`python -m tests.call_log_world`
rewrites it; a test keeps the two equal).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

EXAMPLE_LOG = Path(__file__).resolve().parents[1] / "examples" / "call-usage.jsonl"
TURN_GROWTH = 180  # prompt tokens each later turn adds (the caller's words and the agent's reply)
OPENAI_STEP = 128  # OpenAI caches past its 1,024-token floor in 128-token steps


@dataclass(frozen=True, slots=True)
class WorldAgent:
    agent: str
    direction: str
    api: str  # chat_completions | responses | anthropic_messages
    calls: int
    turn1_prompt: int
    turn1_cached_when_warm: int
    warm_first_turns: int  # of `calls`; the others cache nothing on turn 1
    turns_per_call: tuple[int, ...]  # cycled over the calls

    def turns(self, index: int) -> int:
        return self.turns_per_call[index % len(self.turns_per_call)]

    def warm(self, index: int) -> bool:
        """Warm first turns spread over the calls (not all the short or all the long ones)."""
        return (index * self.warm_first_turns) // self.calls != (
            (index + 1) * self.warm_first_turns
        ) // self.calls


SALES = WorldAgent(
    "outbound-sales", "outbound", "chat_completions", 20, 7200, 1024, 18, (1, 1, 1, 1, 2, 2, 2, 3, 3, 4)
)
RENEWALS = WorldAgent(
    "outbound-renewals", "outbound", "responses", 20, 6000, 5376, 6, (1, 1, 1, 1, 2, 2, 2, 3, 3, 4)
)
SUPPORT = WorldAgent("inbound-support", "inbound", "anthropic_messages", 20, 5000, 4500, 18, (3, 4, 5))
WORLD = (SALES, RENEWALS, SUPPORT)


def prompt_tokens(agent: WorldAgent, turn: int) -> int:
    return agent.turn1_prompt + TURN_GROWTH * (turn - 1)


def cached_tokens(agent: WorldAgent, index: int, turn: int) -> int:
    if turn == 1:
        return agent.turn1_cached_when_warm if agent.warm(index) else 0
    previous = prompt_tokens(agent, turn - 1)
    return previous if agent.api == "anthropic_messages" else previous // OPENAI_STEP * OPENAI_STEP


def usage(agent: WorldAgent, prompt: int, cached: int) -> dict[str, object]:
    """The usage object as each API answers it."""
    if agent.api == "chat_completions":
        return {
            "prompt_tokens": prompt,
            "completion_tokens": 40,
            "total_tokens": prompt + 40,
            "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        }
    if agent.api == "responses":
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": 40,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + 40,
        }
    # Anthropic: input_tokens are the tokens after the last cache breakpoint; a cold first turn writes the
    # stable part to the cache (cache_creation_input_tokens), a later turn writes its new part.
    written = agent.turn1_cached_when_warm if cached == 0 else 0
    return {
        "input_tokens": prompt - cached - written,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": cached,
        "output_tokens": 40,
    }


def records() -> Iterator[dict[str, object]]:
    for agent in WORLD:
        short = agent.agent.split("-")[-1][:5]
        for index in range(agent.calls):
            for turn in range(1, agent.turns(index) + 1):
                prompt = prompt_tokens(agent, turn)
                yield {
                    "call_id": f"{short}-{index + 1:03d}",
                    "turn": turn,
                    "direction": agent.direction,
                    "agent": agent.agent,
                    "usage": usage(agent, prompt, cached_tokens(agent, index, turn)),
                }


def jsonl() -> str:
    return "".join(json.dumps(record, separators=(", ", ": ")) + "\n" for record in records())


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else EXAMPLE_LOG
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(jsonl())
