"""OpenTelemetry traces, off unless `[tracing] enabled`: a tracer provider exporting over OTLP/HTTP, and
the daemon's HTTP clients instrumented with it (httpx instrumentation: a client span per engine or gateway
request, with `traceparent` injected, so an SGLang gateway or engine that traces joins the trace).

The API side is `warmer.api.app`: the ASGI middleware of OpenTelemetry's FastAPI instrumentation, put at
the app's very entry, so the pre-call front door (which answers before FastAPI's stack, where
`FastAPIInstrumentor` would put it) is traced too. A warm that a pre-call ask starts runs in a task the
ask spawns, which inherits the ask's context: its engine requests are children of the ask's span.
"""

from __future__ import annotations

import httpx
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

import warmer
from warmer.config.server_settings import TracingSettings


def tracer_provider(settings: TracingSettings, exporter: SpanExporter | None = None) -> TracerProvider | None:
    """The provider for `settings`, or None when tracing is off. `exporter` replaces OTLP (tests: an
    in-memory exporter, spans exported as each ends)."""
    if not settings.enabled:
        return None
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": settings.service_name, "service.version": warmer.__version__}
        ),
        sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)),
    )
    if exporter is None:
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.otlp_endpoint)))
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def trace_client(client: httpx.AsyncClient, provider: TracerProvider | None) -> None:
    """Spans and `traceparent` for every request `client` sends, when tracing is on."""
    if provider is not None:
        HTTPXClientInstrumentor().instrument_client(client, tracer_provider=provider)
