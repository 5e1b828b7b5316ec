"""OpenTelemetry traces: off by default; when on, a pre-call ask that carries a dialer's `traceparent` is a
span of the call's trace, the warm the ask starts runs inside that trace, and every engine request is a
client span whose own `traceparent` goes to the engine. Spans are read from an in-memory exporter."""

from __future__ import annotations

import asyncio

import httpx
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from tests.unit.reconciler_fakes import FakeEngine, settle, world
from warmer.api import ApiServices, Readiness, create_app
from warmer.config.server_settings import TracingSettings
from warmer.config.settings import Settings
from warmer.core.model import BoxSpec, CompletionReport, Prefix
from warmer.core.planner import PlannerConfig
from warmer.root.tracing import trace_client, tracer_provider
from warmer.service.dialer.prewarm import PrewarmService, ReconcilerBackend
from warmer.testing import is_probe

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"  # W3C Trace Context: version-trace id-parent id-sampled
ON = TracingSettings(enabled=True)


def test_tracing_is_off_by_default() -> None:
    assert Settings().tracing.enabled is False
    assert tracer_provider(Settings().tracing) is None


class TracedEngine(FakeEngine):
    """The fake engine, noting the trace each warm request runs in (as the engine adapter's HTTP call
    would carry it)."""

    def __init__(self, box_ids: tuple[str, ...]) -> None:
        super().__init__(box_ids)
        self.warm_traces: list[tuple[str, str]] = []  # (box, trace id or "none") of each warm, not probes

    async def complete_prefix(
        self, box: BoxSpec, prefix: Prefix, *, suffix: str = "", max_tokens: int = 1, slot: int | None = None
    ) -> CompletionReport:
        context = trace.get_current_span().get_span_context()
        if not is_probe(suffix):
            self.warm_traces.append(
                (box.id, format(context.trace_id, "032x") if context.is_valid else "none")
            )
        return await super().complete_prefix(box, prefix, suffix=suffix, max_tokens=max_tokens, slot=slot)


def test_a_pre_call_asks_traceparent_reaches_the_warm_it_starts(store_url: str) -> None:
    exporter = InMemorySpanExporter()
    provider = tracer_provider(ON, exporter)

    async def scenario() -> tuple[httpx.Response, list[tuple[str, str]]]:
        engine = TracedEngine(("b1", "b2"))
        # Idle agents are not kept warm: once released, only the ask makes the prefix wanted again.
        w = world(store_url, engine=engine, planner=PlannerConfig(retire_idle_after_seconds=1.0))
        await settle(w.reconciler)
        w.clock.t += 3600.0
        await settle(w.reconciler)
        engine.restart("b1")
        engine.restart("b2")  # cold caches, new epochs: the ask's warm really reaches an engine
        await settle(w.reconciler)
        engine.warm_traces.clear()

        async def ready() -> Readiness:
            return Readiness(True)

        services = ApiServices(
            registry=CollectorRegistry(),
            readiness=ready,
            tokens=(SecretStr("t"),),
            prewarm=PrewarmService(ReconcilerBackend(w.reconciler), w.clock, max_wait_seconds=0.0),
            tracer_provider=provider,
        )
        transport = httpx.ASGITransport(app=create_app(services))
        async with httpx.AsyncClient(transport=transport, base_url="http://warmer") as client:
            # No wait: answered "warming" at once, the warm it started goes on in its own task. No loop
            # runs meanwhile, so every warm below is the ask's.
            answer = await client.post(
                "/v1/prewarm",
                json={"agent": "sales", "wait_ms": 0},
                headers={"authorization": "Bearer t", "traceparent": TRACEPARENT},
            )
        await w.reconciler.wait_idle()
        await w.store.close()
        return answer, engine.warm_traces

    answer, warm_traces = asyncio.run(scenario())
    assert answer.status_code == 200
    box = answer.json()["box_id"]
    assert answer.json()["state"] == "warming"
    assert [box_id for box_id, _ in warm_traces] == [box], "the ask started one warm, on the box it named"
    assert [trace_id for _, trace_id in warm_traces] == [TRACE_ID], "and it runs in the dialer's trace"
    (ask,) = [span for span in exporter.get_finished_spans() if span.kind is SpanKind.SERVER]
    assert format(ask.context.trace_id, "032x") == TRACE_ID
    assert ask.parent is not None
    assert format(ask.parent.span_id, "016x") == PARENT_ID, "the ask's span is a child of the dialer's"
    assert ask.resource.attributes["service.name"] == "warmer"


def test_engine_requests_are_client_spans_that_send_their_traceparent() -> None:
    exporter = InMemorySpanExporter()
    provider = tracer_provider(ON, exporter)
    assert provider is not None
    seen: list[str] = []

    def engine(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("traceparent", ""))
        return httpx.Response(200, json={"status": "ok"})

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as client:
            trace_client(client, provider)
            with provider.get_tracer("test").start_as_current_span("warm"):
                await client.get("http://10.0.0.7:8080/health")
            await client.get("http://10.0.0.7:8080/health")  # outside any trace: a root span of its own

    asyncio.run(scenario())
    (warm,) = [span for span in exporter.get_finished_spans() if span.name == "warm"]
    clients = [span for span in exporter.get_finished_spans() if span.kind is SpanKind.CLIENT]
    assert len(clients) == 2
    assert clients[0].parent is not None
    assert clients[0].parent.span_id == warm.context.span_id
    trace_id, span_id = format(warm.context.trace_id, "032x"), format(clients[0].context.span_id, "016x")
    assert seen[0].startswith(f"00-{trace_id}-{span_id}-"), "the engine is told the request's own span"
    assert int(seen[0].rsplit("-", 1)[1], 16) & 1, "sampled"
    assert seen[1].startswith("00-")
    assert trace_id not in seen[1]


def test_probes_and_scrapes_make_no_spans() -> None:
    exporter = InMemorySpanExporter()

    async def ready() -> Readiness:
        return Readiness(True)

    services = ApiServices(
        registry=CollectorRegistry(), readiness=ready, tracer_provider=tracer_provider(ON, exporter)
    )

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=create_app(services))
        async with httpx.AsyncClient(transport=transport, base_url="http://warmer") as client:
            for path in ("/healthz", "/readyz", "/metrics"):
                assert (await client.get(path)).status_code == 200
            assert (await client.get("/v1/boxes")).status_code in (401, 404, 503)

    asyncio.run(scenario())
    assert [span.name for span in exporter.get_finished_spans() if span.kind is SpanKind.SERVER] == [
        "GET /v1/boxes"
    ]
