"""OpenTelemetry in tests: an SDK tracer provider made the global one for one test
(``recorded_spans``), and a span exporter that appends JSON lines to a file, for the
worker processes a test starts (``FLOWWARDEN_TEST_OTEL_FILE``; see ``configure_from_env``)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: The environment variable naming the file a worker process's spans go to.
OTEL_FILE = "FLOWWARDEN_TEST_OTEL_FILE"


@contextmanager
def recorded_spans() -> Iterator[Any]:
    """Make an SDK provider with an in-memory exporter the global tracer provider
    while the block runs (the API allows setting it once per process: this swaps the
    API's private global and puts it back); yields the exporter."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    before = trace._TRACER_PROVIDER
    trace._TRACER_PROVIDER = provider
    try:
        yield exporter
    finally:
        trace._TRACER_PROVIDER = before
        provider.shutdown()


def span_dict(span: Any) -> dict[str, Any]:
    """A finished SDK span as the plain data tests compare."""
    parent = span.parent
    return {
        "name": span.name,
        "trace_id": format(span.context.trace_id, "032x"),
        "span_id": format(span.context.span_id, "016x"),
        "parent_id": None if parent is None else format(parent.span_id, "016x"),
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "events": [event.name for event in span.events],
        "pid": os.getpid(),
    }


class JsonLinesExporter:
    """A span exporter that appends each span as a JSON line to *path* (a worker
    process's spans, for the test that started it)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        with open(self.path, "a", encoding="utf-8") as out:
            for span in spans:
                out.write(json.dumps(span_dict(span)) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def configure_from_env() -> None:
    """In a worker process's settings: when ``FLOWWARDEN_TEST_OTEL_FILE`` is set, an SDK
    tracer provider exporting every span to that file as it ends."""
    path = os.environ.get(OTEL_FILE)
    if not path:
        return
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(path)))
    trace.set_tracer_provider(provider)


def read_spans(path: Path) -> list[dict[str, Any]]:
    """The spans a worker wrote to *path* (none yet: ``[]``)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
