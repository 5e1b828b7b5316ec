"""Pure pieces of the fleet benchmark (`python -m bench.fleet`): the agents it serves and the call schedule.

Agents are written as real agent spec TOML files (static blocks, a tools file, the dynamic tail last) and
loaded back through warmer's own loader, so the benchmark's prompts are exactly what warmer renders. Their
text is generated from a seed (persona, rules, call flow, reference, examples), grown until a turn-1
prompt reaches the target token count.

The schedule is a seeded, deterministic list of calls: Poisson arrivals (uniform order statistics over the
arrival window, which is a Poisson process conditioned on the call count), Zipf popularity over agents,
1-4 turns with a share of one-turn calls, a pause before each later turn, and per-call values for the
dynamic tail. Every policy replays the same schedule.

No I/O here except `write_agent_files`, which only writes the generated files into a directory.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# -- agents ---------------------------------------------------------------------------------------------

MODEL_PROFILE = "tiny-demo"


@dataclass(frozen=True)
class AgentTheme:
    """What one generated agent is about: its id, company, role and the nouns its reference talks of."""

    agent_id: str
    company: str
    role: str
    goal: str
    items: tuple[str, ...]
    tools: tuple[tuple[str, str], ...]  # (name, description)


THEMES: tuple[AgentTheme, ...] = (
    AgentTheme(
        "outbound-sales",
        "Northwind Mobile",
        "a friendly outbound sales agent",
        "offer existing customers a better mobile plan",
        ("plan", "bundle", "roaming pack", "data add-on", "family line"),
        (("send_offer_link", "Send the plan offer link."), ("schedule_callback", "Book a callback.")),
    ),
    AgentTheme(
        "inbound-support",
        "Contoso Fibre",
        "a patient broadband support agent",
        "fix the caller's internet connection or book an engineer",
        ("router model", "line profile", "outage code", "engineer slot", "speed tier"),
        (("run_line_test", "Run a line test."), ("book_engineer", "Book an engineer visit.")),
    ),
    AgentTheme(
        "billing",
        "Fabrikam Energy",
        "a precise billing agent",
        "explain the caller's bill and set up a payment plan if needed",
        ("tariff", "meter reading", "payment plan", "direct debit", "late fee"),
        (("lookup_bill", "Look up a bill."), ("create_payment_plan", "Create a payment plan.")),
    ),
    AgentTheme(
        "appointments",
        "Litware Clinics",
        "a warm clinic receptionist",
        "book, move or cancel the caller's appointment",
        ("clinic", "practitioner", "slot", "referral", "follow-up visit"),
        (("find_slots", "Find free slots."), ("book_slot", "Book a slot."), ("cancel_slot", "Cancel.")),
    ),
    AgentTheme(
        "collections",
        "Tailspin Finance",
        "a respectful payment reminder agent",
        "agree a date for an overdue payment without pressure",
        ("balance", "instalment", "grace period", "hardship code", "settlement"),
        (("record_promise", "Record a promise to pay."), ("flag_hardship", "Flag hardship.")),
    ),
    AgentTheme(
        "survey",
        "Adatum Travel",
        "a cheerful survey caller",
        "ask five short questions about the caller's last trip",
        ("question", "rating", "route", "lounge", "voucher"),
        (("save_answer", "Save one answer."), ("send_voucher", "Send the thank-you voucher.")),
    ),
    # the crowded shape's six more: 12 agents on 3 boxes x 2 slots, as the field reports' fleets run
    AgentTheme(
        "claims",
        "Humongous Insurance",
        "a careful claims intake agent",
        "take the first notice of the caller's car or home insurance claim",
        ("claim type", "excess", "repair shop", "courtesy car", "incident report"),
        (("open_claim", "Open a claim."), ("book_assessor", "Book an assessor visit.")),
    ),
    AgentTheme(
        "delivery-rebooking",
        "Proseware Parcels",
        "a quick delivery rebooking agent",
        "move a missed parcel delivery to a time that suits the caller",
        ("parcel", "delivery window", "safe place", "pickup point", "signature option"),
        (("rebook_delivery", "Rebook a delivery."), ("set_safe_place", "Set a safe place.")),
    ),
    AgentTheme(
        "fraud-alert",
        "Woodgrove Bank",
        "a calm card security agent",
        "confirm or deny a flagged card payment with the card holder",
        ("flagged payment", "card freeze", "replacement card", "merchant", "travel notice"),
        (("confirm_payment", "Confirm a flagged payment."), ("freeze_card", "Freeze the card.")),
    ),
    AgentTheme(
        "flight-rebooking",
        "Blue Yonder Airlines",
        "a helpful flight disruption agent",
        "rebook the caller onto another flight after a cancellation",
        ("flight", "seat", "fare class", "meal voucher", "hotel night"),
        (
            ("find_flights", "Find other flights."),
            ("rebook_flight", "Rebook."),
            ("issue_voucher", "Voucher."),
        ),
    ),
    AgentTheme(
        "admissions",
        "Graphic Design Institute",
        "a friendly admissions adviser",
        "follow up on the caller's course enquiry and book an open day",
        ("course", "intake", "open day", "bursary", "campus tour"),
        (("book_open_day", "Book an open day."), ("send_prospectus", "Send the prospectus.")),
    ),
    AgentTheme(
        "wine-club",
        "Coho Winery",
        "a knowledgeable wine club host",
        "renew the caller's wine club membership and pick the next case",
        ("case", "vintage", "tasting", "membership tier", "shipping day"),
        (("pick_case", "Pick the next case."), ("renew_membership", "Renew the membership.")),
    ),
)

# Named agent counts, so a figure says which fleet it is from: `default` is 6 agents on 3 boxes x 2
# slots (every prompt can be resident at once); `crowded` is 12 (twice what the slots hold: routing
# alone cannot keep every agent warm, which is the seeds' field shape).
SHAPES: dict[str, int] = {"default": 6, "crowded": 12, "realmix": 12}


@dataclass(frozen=True)
class CallMix:
    """A shape's call mix beyond reply turns (`realmix`, the seeds' calls): turn-1 prompt sizes spread
    over a range instead of one size, how many turns a call makes, the share of later turns that carry a
    tool result before the caller's words, and one background request per call with a prefix of its own
    (a transcript summary or classifier, as voice stacks run beside the call)."""

    prompt_tokens: tuple[int, int] | None = None  # (low, high) spread over the agents; None: --prompt-tokens
    turn_weights: tuple[float, ...] | None = None  # None: DEFAULT_TURN_WEIGHTS
    tool_share: float = 0.0
    background: bool = False
    ctx_per_slot: int = 4096  # each llama-server slot's context (`-c` = slots x this)


# The seeds' calls on the testbed's model: prompts spread over 800-2,600 tokens, a median of 6 turns (1-10),
# a tool result in 30% of later turns, and one background request per call. Slots of 8,192 tokens: a
# 10-turn call on the largest prompt outgrew 4,096 (HTTP 400 at turn 7 or later in the first look), and the
# seeds' calls fit their model's context; the slot count, so the prompts a box holds, is unchanged.
REALMIX_TURN_WEIGHTS: tuple[float, ...] = (0.04, 0.06, 0.08, 0.10, 0.14, 0.16, 0.14, 0.11, 0.09, 0.08)
MIXES: dict[str, CallMix] = {
    "realmix": CallMix(
        prompt_tokens=(800, 2600),
        turn_weights=REALMIX_TURN_WEIGHTS,
        tool_share=0.3,
        background=True,
        ctx_per_slot=8192,
    ),
}


def prompt_targets(
    agents: Sequence[str], spread: tuple[int, int] | None, fixed: int, seed: int
) -> dict[str, int]:
    """Each agent's turn-1 prompt size: `fixed`, or spread evenly over `spread` in a seeded order (so
    prompt size and popularity are not tied)."""
    if spread is None or len(agents) < 2:
        return dict.fromkeys(agents, fixed)
    low, high = spread
    sizes = [round(low + (high - low) * i / (len(agents) - 1)) for i in range(len(agents))]
    random.Random(seed).shuffle(sizes)
    return dict(zip(agents, sizes, strict=True))


_ADJECTIVES = ("basic", "standard", "plus", "premium", "flex", "saver", "classic", "express", "prime")
_CLAUSES = (
    "it can be changed at any time without a fee",
    "it needs a confirmation by text message before it applies",
    "it is only available to customers of more than a year",
    "it starts on the first day of the next billing month",
    "the caller must hear the full terms before agreeing",
    "it cannot be combined with another promotion",
    "a supervisor must approve it when the amount is above the limit",
    "it is free for the first three months",
)
_RULES = (
    "Never read the call details out as a list; use them naturally.",
    "Keep every reply under three short sentences: this is a phone call.",
    "If the caller asks for a human, offer a callback and end politely.",
    "Never promise a price or a date that is not in the reference below.",
    "If the caller is driving or busy, offer to call back later.",
    "Confirm any change by repeating it once, slowly, before you act.",
    "Do not ask for card numbers or passwords; the systems never need them.",
    "If you did not understand, ask one short question instead of guessing.",
    "Use the tools for every change; never claim something is done before the tool answers.",
    "Stay calm if the caller is upset; acknowledge the feeling, then offer the next step.",
)
_STEPS = (
    "Greet the caller by first name and say who you are and why you call.",
    "Check it is a good moment; if not, offer a callback time.",
    "Ask one open question to learn what matters to the caller.",
    "Match what you heard to one option from the reference.",
    "Explain that option in one or two sentences with its price.",
    "Answer questions using only the reference; say when you do not know.",
    "Ask for a clear yes or no before using a tool.",
    "Summarise what happens next and thank the caller.",
)


def _reference_entry(theme: AgentTheme, rng: random.Random, index: int) -> str:
    item = theme.items[index % len(theme.items)]
    code = f"{theme.agent_id[:2].upper()}-{100 + index * 7}"
    return (
        f"- {item.capitalize()} {code} ({rng.choice(_ADJECTIVES)}): {rng.randint(2, 90)} units, "
        f"{rng.randint(5, 80)}.{rng.randint(0, 99):02d} a month; {rng.choice(_CLAUSES)}."
    )


def _example(theme: AgentTheme, rng: random.Random, index: int) -> str:
    item = theme.items[rng.randrange(len(theme.items))]
    return (
        f"Example {index + 1}.\nCaller: What about the {item}?\n"
        f"You: The {rng.choice(_ADJECTIVES)} {item} is what most people pick; shall I tell you the price?"
    )


@dataclass(frozen=True)
class AgentFiles:
    """The files of one generated agent: `<id>.toml` and `<id>.tools.json`, as text."""

    agent_id: str
    toml: str
    tools_json: str


def _toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes (\\n, \\", \\\\, \\uXXXX) are valid TOML ones."""
    return json.dumps(text, ensure_ascii=False)


def agent_files(
    theme: AgentTheme, reference_entries: int, seed: int, model: str = MODEL_PROFILE
) -> AgentFiles:
    """One agent spec in the layout of config/agents/outbound-sales.toml, with `reference_entries` facts,
    for the model profile `model`."""
    rng = random.Random(f"{seed}:{theme.agent_id}")
    persona = (
        f"You are {theme.role} for {theme.company}.\nYour job on this call: {theme.goal}.\n"
        "The caller's name, the local time and the call id are given at the end of this prompt, in the "
        "call details.\nYour voice is calm and warm. You never pressure anyone."
    )
    rules = "Rules:\n" + "\n".join(f"{i + 1}. {rule}" for i, rule in enumerate(rng.sample(_RULES, 8)))
    flow = "Call flow:\n" + "\n".join(f"Step {i + 1}: {step}" for i, step in enumerate(_STEPS))
    reference = f"Reference for {theme.company}:\n" + "\n".join(
        _reference_entry(theme, rng, i) for i in range(reference_entries)
    )
    examples = "Examples:\n" + "\n\n".join(_example(theme, rng, i) for i in range(3))
    blocks = [("persona", persona), ("rules", rules), ("call-flow", flow)]
    blocks += [("reference", reference), ("examples", examples)]
    lines = [
        "# Generated by bench/fleet_plan.py: per-call values only in the dynamic tail, rendered last.",
        f'model = "{model}"',
        f'tools_file = "{theme.agent_id}.tools.json"',
        "",
    ]
    for name, text in blocks:
        lines += ["[[blocks]]", f'name = "{name}"', f"text = {_toml_string(text)}", ""]
    tail = (
        "Call details\nCustomer: {customer_name}\nLocal time: {now}\nCall id: {call_id}\n"
        "The call has just connected. Start with the greeting."
    )
    lines += ["[dynamic]", 'role = "user"', f"template = {_toml_string(tail)}", ""]
    lines += ["[placeholders]", 'customer_name = "name"', 'now = "datetime"', 'call_id = "uuid"', ""]
    tools = [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {
                    "type": "object",
                    "properties": {"note": {"type": "string", "description": "What the caller agreed."}},
                    "required": ["note"],
                },
            },
        }
        for name, description in theme.tools
    ]
    return AgentFiles(theme.agent_id, "\n".join(lines), json.dumps(tools, indent=1))


def grow_agent(
    theme: AgentTheme,
    seed: int,
    target_tokens: int,
    turn1_tokens: Callable[[AgentFiles], int],
    model: str = MODEL_PROFILE,
) -> AgentFiles:
    """The smallest number of reference entries whose turn-1 prompt reaches `target_tokens` (counted by
    the injected `turn1_tokens`, which renders and tokenizes exactly as warmer does)."""
    entries = 1
    files = agent_files(theme, entries, seed, model)
    while turn1_tokens(files) < target_tokens:
        entries += 1
        if entries > 10_000:
            raise ValueError(f"{theme.agent_id}: cannot reach {target_tokens} turn-1 tokens")
        files = agent_files(theme, entries, seed, model)
    return files


def write_agent_files(directory: Path, files: Sequence[AgentFiles]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for agent in files:
        (directory / f"{agent.agent_id}.toml").write_text(agent.toml)
        (directory / f"{agent.agent_id}.tools.json").write_text(agent.tools_json)


# -- the call schedule ----------------------------------------------------------------------------------

_FIRST = ("Ana", "Bilal", "Chen", "Dana", "Emeka", "Farah", "Gita", "Hugo", "Ines", "Jonas", "Kemal", "Lea")
_LAST = ("Souza", "Khan", "Wei", "Levi", "Obi", "Aziz", "Rao", "Lenz", "Moreau", "Berg", "Yilmaz", "Costa")
_USER_LINES = (
    "Hello? Yes, this is me. Who is calling?",
    "Okay, go on, but I only have a minute.",
    "How much would that cost me each month?",
    "Can you send me the details by text?",
    "No thanks, I am happy with what I have.",
    "Wait, what happens at the end of the contract?",
    "Is there a fee if I change my mind later?",
    "Could you call me back tomorrow morning?",
    "Sorry, I did not catch that. Say it again?",
    "Fine, let us do it. What do you need from me?",
)
DEFAULT_TURN_WEIGHTS: tuple[float, ...] = (0.35, 0.25, 0.2, 0.2)  # 1, 2, 3, 4 turns


@dataclass(frozen=True)
class TurnPlan:
    """A later turn: wait `pause_s` after the previous reply, then say `user_text` (after `tool_result`,
    the answer of a tool the agent called, when the turn carries one)."""

    pause_s: float
    user_text: str
    tool_result: str | None = None


@dataclass(frozen=True)
class CallPlan:
    """One scheduled call: when it starts (seconds from traffic start), its agent, its tail values, and
    the turns after turn 1 (turn 1 is the agent's prompt with the values in the dynamic tail)."""

    index: int
    call_id: str
    agent: str
    start_s: float
    values: Mapping[str, str]
    later_turns: tuple[TurnPlan, ...] = field(default_factory=tuple)
    background_after: int | None = None  # the turn after which the call's background request is sent

    @property
    def turns(self) -> int:
        return 1 + len(self.later_turns)


@dataclass(frozen=True)
class ScheduleSpec:
    """The traffic knobs. `arrival_window_s`: calls start within [0, window]; `zipf_s`: popularity
    exponent over agents in the given order (s = 1 gives the first ~41% of calls over 6 agents, ~32% over
    12)."""

    calls: int = 110
    arrival_window_s: float = 200.0
    zipf_s: float = 1.0
    turn_weights: tuple[float, ...] = DEFAULT_TURN_WEIGHTS
    pause_s: tuple[float, float] = (2.0, 6.0)
    seed: int = 7
    tool_share: float = 0.0  # share of later turns carrying a tool result
    background: bool = False  # one background request per call (`CallMix`)

    def __post_init__(self) -> None:
        if self.calls < 1:
            raise ValueError(f"calls must be >= 1, got {self.calls}")
        if self.arrival_window_s <= 0:
            raise ValueError(f"arrival_window_s must be > 0, got {self.arrival_window_s}")
        if not self.turn_weights or any(w < 0 for w in self.turn_weights) or sum(self.turn_weights) <= 0:
            raise ValueError("turn_weights must be non-negative with a positive sum")
        low, high = self.pause_s
        if low < 0 or high < low:
            raise ValueError(f"pause_s must be 0 <= low <= high, got {self.pause_s}")
        if not 0.0 <= self.tool_share <= 1.0:
            raise ValueError(f"tool_share must be within [0, 1], got {self.tool_share}")


def zipf_weights(n: int, s: float) -> list[float]:
    """Normalized Zipf weights 1/k^s for ranks 1..n."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    raw = [1.0 / (k**s) for k in range(1, n + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def make_schedule(spec: ScheduleSpec, agents: Sequence[str]) -> list[CallPlan]:
    """The seeded call schedule, sorted by start time; the same spec and agents give the same calls."""
    if not agents:
        raise ValueError("at least one agent is required")
    rng = random.Random(spec.seed)
    starts = sorted(rng.uniform(0.0, spec.arrival_window_s) for _ in range(spec.calls))
    weights = zipf_weights(len(agents), spec.zipf_s)
    turn_counts = list(range(1, len(spec.turn_weights) + 1))
    calls = []
    for index, start in enumerate(starts):
        agent = rng.choices(list(agents), weights=weights)[0]
        turns = rng.choices(turn_counts, weights=spec.turn_weights)[0]
        call_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        minute = rng.randrange(8 * 60, 20 * 60)
        values = {
            "customer_name": f"{rng.choice(_FIRST)} {rng.choice(_LAST)}",
            "now": f"{1 + index % 28} December 2026, {minute // 60:02d}:{minute % 60:02d}",
            "call_id": call_id,
        }
        later = tuple(
            TurnPlan(round(rng.uniform(*spec.pause_s), 3), rng.choice(_USER_LINES), _tool_result(spec, rng))
            for _ in range(turns - 1)
        )
        background = min(2, turns) if spec.background else None
        calls.append(CallPlan(index, call_id, agent, round(start, 3), values, later, background))
    return calls


def _tool_result(spec: ScheduleSpec, rng: random.Random) -> str | None:
    """A tool's JSON answer, in `tool_share` of later turns (drawn only when the share is set, so the
    schedules of the other shapes stay as they were)."""
    if spec.tool_share <= 0 or rng.random() >= spec.tool_share:
        return None
    reference = f"R-{rng.randrange(10_000, 99_999)}"
    status = rng.choice(("confirmed", "pending", "not found", "needs a supervisor"))
    slots = ", ".join(f"{rng.randrange(8, 18)}:{rng.choice(('00', '30'))}" for _ in range(3))
    return json.dumps(
        {"reference": reference, "status": status, "next_free": slots, "note": rng.choice(_USER_LINES)}
    )


# The background request every `realmix` call makes once (after its second turn): a transcript summary with
# instructions of its own, so it shares no prefix with any agent and competes with them for cache room.
BACKGROUND_INSTRUCTIONS = (
    "You summarise a customer phone call for the agent desk. Read the transcript below and write one "
    "line: the caller's intent, what was agreed, and any follow-up with its date. Use plain words, no "
    "lists, no names of internal systems. If the call was cut short, say so. If a payment, a booking or a "
    "cancellation was agreed, name it first. Never add facts that are not in the transcript; when something "
    "is unclear, write 'unclear'. The desk reads hundreds of these a day: keep it under thirty words."
)


def background_prompt(transcript: Sequence[tuple[str, str]]) -> str:
    """The background request of a call: fixed instructions, then the call so far."""
    lines = [f"{speaker}: {text}" for speaker, text in transcript]
    return BACKGROUND_INSTRUCTIONS + "\n\nTranscript:\n" + "\n".join(lines) + "\n\nSummary:"


def agent_shares(calls: Sequence[CallPlan]) -> dict[str, float]:
    """Share of calls per agent."""
    counts: dict[str, int] = {}
    for call in calls:
        counts[call.agent] = counts.get(call.agent, 0) + 1
    return {agent: count / len(calls) for agent, count in counts.items()}
