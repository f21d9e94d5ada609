"""OpenTelemetry spans for pipeline runs and batches, when a pipeline enables tracing.

Without ``Tracing(enabled=True)`` nothing here imports OpenTelemetry. With it, spans
go through ``opentelemetry-api``; they are exported only if an SDK tracer provider
is installed: by the application, or by ``configure_exporter`` (the ``tracing`` extra)
from a config file's ``exporter = "console" | "otlp"``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from agora_pg.errors import ConfigError

EXPORTERS = ("none", "console", "otlp")


@dataclasses.dataclass(frozen=True)
class Tracing:
    """Tracing of one pipeline: ``service_name`` names the tracer's service."""

    enabled: bool = True
    service_name: str = "agora-pg"
    exporter: str = "none"  # installed by configure_exporter: none (the application's provider), console, otlp
    endpoint: str | None = None  # OTLP endpoint, e.g. http://localhost:4318/v1/traces

    def __post_init__(self) -> None:
        if self.exporter not in EXPORTERS:
            raise ValueError(f"exporter must be one of {', '.join(EXPORTERS)}, got {self.exporter!r}")


@contextlib.contextmanager
def span(tracing: Tracing | None, name: str, attributes: Mapping[str, Any]) -> Iterator[Any]:
    """A span named ``name`` when tracing is enabled, else nothing (yields None)."""
    if tracing is None or not tracing.enabled:
        yield None
        return
    from opentelemetry import trace

    tracer = trace.get_tracer("agora_pg.pipelines", attributes={"service.name": tracing.service_name})
    with tracer.start_as_current_span(name, attributes=dict(attributes)) as current:
        yield current


_configured: set[tuple[str, str | None, str]] = set()


def configure_exporter(tracing: Tracing) -> None:
    """Install an SDK tracer provider exporting to the console or OTLP (once per process)."""
    if not tracing.enabled or tracing.exporter == "none":
        return
    key = (tracing.exporter, tracing.endpoint, tracing.service_name)
    if key in _configured:
        return
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    except ImportError:
        raise ConfigError("tracing.exporter", "needs the OpenTelemetry SDK: pip install -e '.[tracing]' in agora-pg's checkout") from None
    exporter: SpanExporter
    if tracing.exporter == "console":
        exporter = ConsoleSpanExporter()
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise ConfigError("tracing.exporter", "otlp needs pip install -e '.[tracing]' in agora-pg's checkout") from None
        exporter = OTLPSpanExporter(endpoint=tracing.endpoint) if tracing.endpoint else OTLPSpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": tracing.service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _configured.add(key)
