"""Domain structs shared by every layer. Frozen dataclasses: values, not services."""

from __future__ import annotations

import enum
import functools
import hashlib
from dataclasses import dataclass, field, replace

from warmer.core.hosted import ProviderCache


class EngineKind(enum.StrEnum):
    SGLANG = "sglang"
    VLLM = "vllm"
    LLAMACPP = "llamacpp"
    OPENAI = "openai"
    # Hosted APIs (`warmer.core.hosted`): a provider endpoint is a box; its profile has a [provider] table.
    OPENAI_HOSTED = "openai-hosted"
    ANTHROPIC = "anthropic"

    @property
    def hosted(self) -> bool:
        """A hosted provider's API, not an engine warmer can address process by process."""
        return self in (EngineKind.OPENAI_HOSTED, EngineKind.ANTHROPIC)


@dataclass(frozen=True, slots=True)
class SampledRequest:
    """A request that compiles the sampling kernels (temperature > 0)."""

    prompt: str = "Say hello."
    max_tokens: int = 8
    temperature: float = 0.7


@dataclass(frozen=True, slots=True)
class ConstrainedRequest:
    """A request with constrained output, so the grammar backend loads before real traffic needs it."""

    prompt: str = "Reply with a JSON object."
    json_schema: dict[str, object] = field(
        default_factory=lambda: {
            "type": "object",
            "properties": {"ok": {"type": "boolean"}},
            "required": ["ok"],
        }
    )
    max_tokens: int = 16


@dataclass(frozen=True, slots=True)
class RestartRecipe:
    """What a fresh engine process gets before real traffic, in this order, then the prefixes."""

    sampled: SampledRequest | None = field(default_factory=SampledRequest)
    constrained: ConstrainedRequest | None = field(default_factory=ConstrainedRequest)
    burst_levels: tuple[int, ...] = (1, 4, 16)  # concurrency levels, capped at the box's slot count
    burst_max_tokens: int = 4
    # 0 = sized to the longest prompt the box's calls send: the longest stable prefix of the model's
    # agents times `long_prefill_headroom` (their dynamic tail and a few turns), within the context minus a
    # margin; the whole context when no prefix is known yet. A prefill longer than any real request only
    # adds warm traffic on every box at every restart.
    long_prefill_tokens: int = 0
    long_prefill_margin_tokens: int = 64
    long_prefill_headroom: float = 1.25


class MambaStrategy(enum.StrEnum):
    """Where SGLang stores the running state of a hybrid (Mamba) model in its radix tree.

    sglang 0.5.23 (PyPI) `--mamba-radix-cache-strategy` (earlier `--mamba-scheduler-strategy`):
    `no_buffer` stores a state only at a finished request's end (mem_cache/unified_cache/components/
    mamba.py `prepare_for_caching_req`: cache_len = token_ids_len; sgl-project/sglang
    python/sglang/srt/mem_cache/mamba_radix_cache.py @ 00df707e `cache_finished_req` likewise), and a node
    split by a diverging request keeps no state (`_split_node`: "mamba cache can not be split");
    `extra_buffer` (and `extra_buffer_lazy`) tracks it at `prefix_len + (extend_len // grid) * grid`
    (managers/schedule_batch.py `_mamba_radix_cache_v2_req_prepare_for_extend`),
    grid = lcm(mamba_cache_chunk_size, page_size).
    """

    NO_BUFFER = "no_buffer"
    EXTRA_BUFFER = "extra_buffer"


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """Facts about a served model that change how it is warmed (one `models/*.toml`)."""

    name: str
    engine: EngineKind
    served_model_name: str = ""  # the `model` field sent to the engine; "" = the engine's default
    running_state: bool = False  # hybrid / Mamba-style: a hit only reaches the last stored state
    warm_requests_per_prefix: int = 1  # requests one warm costs (the planner's load estimate)
    slots: int = 1
    context_length: int = 4096
    # Fallback cache granularity, used only when the server does not report its page/block size
    # (SGLang /server_info page_size, vLLM vllm:cache_config_info{block_size}): see `CacheLayout`.
    block_tokens: int = 1
    # The model's own `mamba_chunk_size` (its HF config; SGLang uses FLA_CHUNK_SIZE 64 without one): SGLang's
    # extra_buffer checkpoints land on multiples of max(this, page_size).
    mamba_chunk_size: int = 64
    # The Mamba strategy the boxes are launched with, used only when /server_info does not name one.
    mamba_strategy: MambaStrategy | None = None
    restart: RestartRecipe = field(default_factory=RestartRecipe)
    chat_template: str | None = None  # jinja2 source, when the engine cannot render for us
    tokenizer_file: str | None = None  # a `tokenizers` JSON file, when the engine cannot tokenize
    bos_token: str = ""
    eos_token: str = ""
    keepalive_seconds: float = 240.0  # touch a warm prefix again this often (just under eviction)
    # Uncached prompt tokens/s one box computes at full load; None = measure it (restart long prefill).
    prefill_tokens_per_second: float | None = None
    # A hosted model's cache rules and prices (engine kinds `openai-hosted`, `anthropic`); None for engines.
    provider: ProviderCache | None = None


@dataclass(frozen=True, slots=True)
class CacheLayout:
    """How the running server counts a prefix-cache hit, as it reports it (None: it did not say)."""

    page_tokens: int | None = None  # hits come in whole pages/blocks of this many tokens
    mamba_strategy: MambaStrategy | None = None  # hybrid models on SGLang
    mamba_chunk_tokens: int | None = None  # the server's own mamba_cache_chunk_size, when it reports one
    source: str = ""  # where the numbers came from, for outcomes and logs
    # Data-parallel ranks behind the box's one URL, each with its own cache (SGLang --dp-size)
    data_parallel_ranks: int = 1
    # The server counts tokens its own way (a hosted provider's private tokenizer and request rendering):
    # warmer's count of the prefix is an estimate, so the server's count of the prefix sent alone is the bar.
    counts_own_tokens: bool = False

    def __post_init__(self) -> None:
        for name in ("page_tokens", "mamba_chunk_tokens", "data_parallel_ranks"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")


class CacheTier(enum.StrEnum):
    """Where a cache hit may come from and still count as warm (SGLang HiCache reports both)."""

    DEVICE = "device"  # GPU memory only: a host-memory hit still copies the KV back before prefill
    HOST = "host"  # GPU or host memory


@dataclass(frozen=True, slots=True)
class KvEventsEndpoint:
    """Where a box publishes its KV cache events (vLLM `--kv-events-config`): ZMQ PUB, optional replay."""

    endpoint: str  # e.g. tcp://10.0.0.5:5557 (the engine binds tcp://*:5557)
    replay_endpoint: str | None = None  # its ROUTER socket, e.g. tcp://10.0.0.5:5558
    topic: str = ""
    hash_seed: str | None = None  # the server's PYTHONHASHSEED (with sha256_cbor): hashes computable


@dataclass(frozen=True, slots=True)
class BoxSpec:
    """One engine endpoint (a GPU server or DP rank) as configured."""

    id: str
    base_url: str
    engine: EngineKind
    model: str  # name of a ModelProfile
    slots: int = 1
    group: str = ""  # optional placement group (e.g. a rack, a region, a dedicated pool)
    cache_capacity_tokens: int | None = None  # prefix tokens the box can hold, when known
    prefix_capacity: int | None = None  # distinct prefixes the box can hold at once, when known
    kv_events: KvEventsEndpoint | None = None  # its cache event stream, when it publishes one
    # SGLang with HiCache: which cached tokens count as warm ("device": GPU only; "host": GPU + host memory)
    warm_tier: CacheTier = CacheTier.DEVICE
    # SGLang `--radix-eviction-policy priority`: the priority warm requests carry (None: none sent)
    warm_priority: int | None = None

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("box id must not be empty")
        if self.slots < 1:
            raise ValueError("box slots must be >= 1")
        if self.prefix_capacity is not None and self.prefix_capacity < 1:
            raise ValueError("box prefix_capacity must be >= 1")


@dataclass(frozen=True, slots=True)
class BoxCapacity:
    """What a box's cache can hold beside its live calls, as the engine itself reports it.

    Warming more prefixes than fit only evicts what was just warmed, so placement never gives a box more
    than this. `prefixes`: distinct prompts held at once (llama.cpp keeps one prompt per slot);
    `tokens`: prefix tokens (a shared token pool: vLLM blocks x block size, SGLang's token pool), already
    reduced to the share left for prefixes beside live calls. None: the engine does not say.
    """

    prefixes: int | None = None
    tokens: int | None = None
    source: str = ""  # where the figures came from, for status and logs
    # One prompt per slot, and a request may name its slot (llama.cpp `id_slot`): warmer then pins each
    # prefix to a slot of its own, so its own requests and pinned calls never evict a neighbour's prompt.
    pinnable_slots: int | None = None
    # A shared token pool's size, and the share of it live requests hold now (cached tokens no request holds
    # count as free: the engine evicts them for new work). `tokens` is the prefix budget derived from these
    # (`warmer.core.capacity.prefix_budget_tokens`); keeping the inputs lets the reconciler re-derive it with
    # its configured headroom and say in its log why the budget moved.
    pool_tokens: int | None = None
    used_share: float | None = None
    # The engine's own version, where the same reading reports it (SGLang /server_info `version`,
    # llama.cpp /props `build_info`): the per-box info metric tells engines apart across an upgrade.
    version: str = ""

    def applied_to(self, box: BoxSpec) -> BoxSpec:
        """The box with these limits where its configuration does not set its own (configuration wins)."""
        return replace(
            box,
            prefix_capacity=box.prefix_capacity if box.prefix_capacity is not None else self.prefixes,
            cache_capacity_tokens=(
                box.cache_capacity_tokens if box.cache_capacity_tokens is not None else self.tokens
            ),
        )


@dataclass(frozen=True, slots=True)
class Prefix:
    """An agent's exact stable prefix, as the warm request will send it.

    `text` is the rendered prompt text up to the stable boundary; `token_ids`, when known, are the
    engine's own tokens for it (sending ids makes the cached run end exactly at the boundary).
    """

    text: str
    token_count: int
    token_ids: tuple[int, ...] | None = None
    model: str = ""
    # Computed once: read on hot paths (several times per pre-call ask, per agent in every plan), where even
    # the cached function below costs ~30 µs a call for a 3,000-token prefix (hashing the tuple of ids).
    hash: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hash", prefix_hash(self.text, self.token_ids))


# Cached: prefixes are rebuilt from the same text and ids (store rows, staged prompts); sha256 over thousands
# of ids costs ~1 ms.
@functools.lru_cache(maxsize=1024)
def prefix_hash(text: str, token_ids: tuple[int, ...] | None = None) -> str:
    """Identity of a prefix: two agents whose prefixes are byte-identical share one cache entry."""
    digest = hashlib.sha256()
    if token_ids is not None:
        digest.update(b"ids:")
        digest.update(",".join(map(str, token_ids)).encode())
    else:
        digest.update(b"text:")
        digest.update(text.encode())
    return digest.hexdigest()[:32]


class WarmState(enum.StrEnum):
    """Life of one (box, epoch, prefix). `warm` only ever means "the engine reported the hit"."""

    COLD = "cold"
    WARMING = "warming"
    WARM = "warm"
    FAILED = "failed"
    STALE = "stale"  # keepalive due: still believed warm, touch it again
    EVICTED = "evicted"  # a probe or the hit rate says the engine no longer holds it


class PhaseName(enum.StrEnum):
    """Restart warm-up phases, in the order they run."""

    SAMPLED = "sampled"
    CONSTRAINED = "constrained"
    BURST = "burst"
    LONG_PREFILL = "long_prefill"
    PREFIXES = "prefixes"


@dataclass(frozen=True, slots=True)
class CompletionReport:
    """What one engine request told us: how many prompt tokens, how many of them came from cache."""

    prompt_tokens: int
    cached_tokens: int
    wall_seconds: float
    engine_seconds: float | None = None  # the engine's own prefill+decode time when it reports one
    prompt_seconds: float | None = None  # the engine's own prefill time alone, when it reports it
    text: str = ""
    # Why `cached_tokens` may not be the whole story (e.g. the engine sent `prompt_tokens_details: null`,
    # which means 0 cached but also what a server with cache reporting off sends); shown on a miss.
    cache_note: str | None = None
    slot: int | None = None  # the engine slot that served it, where the engine has slots (llama.cpp)


@dataclass(frozen=True, slots=True)
class CacheStats:
    """An engine's own cumulative prefix-cache counters (tokens), for hit rates between two scrapes."""

    queried_tokens: float | None  # prompt tokens looked up in the cache
    hit_tokens: float | None  # of those, tokens served from cache


@dataclass(frozen=True, slots=True)
class WarmRecord:
    """Warm state of one prefix on one box in one epoch."""

    box_id: str
    epoch: str
    prefix_hash: str
    state: WarmState
    prefix_tokens: int
    verified_cached_tokens: int | None = None
    attempts: int = 0
    last_error: str | None = None
    updated_at: float = 0.0  # unix seconds
    warmed_at: float | None = None
    verified_at: float | None = None


@dataclass(frozen=True, slots=True)
class PhaseRecord:
    box_id: str
    epoch: str
    phase: PhaseName
    started_at: float
    finished_at: float | None = None
    engine_seconds: float | None = None
    requests: int = 0
    ok: bool | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Campaign:
    """A dialer schedule entry: its agent's prefixes are warm from `starts_at - lead` until `ends_at`."""

    id: str
    agent_id: str
    starts_at: float
    ends_at: float
    expected_calls: int = 0


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    """One line of the append-only history."""

    at: float
    kind: str
    box_id: str | None = None
    agent_id: str | None = None
    epoch: str | None = None
    prefix_hash: str | None = None
    detail: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries as data (from settings): how often and how patiently a transient failure is retried."""

    attempts: int = 3  # total tries, including the first
    initial_backoff_seconds: float = 0.2
    max_backoff_seconds: float = 2.0
    jitter_seconds: float = 0.1


@dataclass(frozen=True, slots=True)
class EngineTimeouts:
    """Per-call bounds on engine traffic, in seconds."""

    connect: float = 2.0
    health: float = 3.0
    request: float = 60.0  # one warm / probe request (a long cold prefill may take a while)
    long_request: float = 300.0  # restart warm-up long prefill and bursts
