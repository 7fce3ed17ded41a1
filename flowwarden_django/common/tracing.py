"""OpenTelemetry spans, when ``opentelemetry-api`` is installed (the ``otel`` extra)
and the project has configured an SDK's tracer provider; otherwise nothing happens and
nothing of OpenTelemetry is imported.

The spans: ``flowwarden.workflow.run`` (one per execution of a run: a ``run_local``
call, a Celery task, a Temporal activity), ``flowwarden.workflow.step`` (one per step
attempt), ``flowwarden.approval.decide`` and ``flowwarden.stream.event``. A run keeps
the trace context of the code that started it (``traceparent`` in its seed snapshot's
metadata), and every execution's span continues that trace, wherever and whenever it
runs: another worker, after a crash and the recovery sweep. A run started outside any
trace gets one from a ``flowwarden.workflow.start`` span.

No exporter is chosen here: configure the SDK (``TracerProvider`` with the exporter
of your collector) in settings or the worker's startup.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping
from importlib.util import find_spec
from threading import Lock
from typing import Any

from .json_metadata import json_object

#: The metadata key of a run's seed snapshot that keeps its trace context (a JSON
#: object of W3C trace-context headers: ``traceparent``, ``tracestate``).
TRACE_CONTEXT = "workflow.traceContext"
TRACER_NAME = "flowwarden_django"

_NO_SPAN = contextlib.nullcontext()
_UNKNOWN = object()
#: The environment variable that makes the API load a tracer provider by itself.
_PROVIDER_VARIABLE = "OTEL_PYTHON_TRACER_PROVIDER"
_api: Any = None  # the opentelemetry modules once looked for: False when absent


def _otel() -> Any:
    global _api
    if _api is None:
        try:
            present = find_spec("opentelemetry.trace") is not None
        except (ImportError, ValueError):  # a parent that is not a package, or blocked
            present = False
        if not present:
            _api = False
        else:
            from opentelemetry import propagate, trace

            # Read once: the variable is set before the process starts, and a lookup
            # in os.environ costs microseconds.
            _api = (trace, propagate, bool(os.environ.get(_PROVIDER_VARIABLE)))
    return _api


def recording() -> bool:
    """Whether spans are recorded: the API is installed and a tracer provider other
    than the API's default (which records nothing) is set.

    Asked per step attempt and per stream event, so it reads the API's global
    directly (``set_tracer_provider`` sets it once): ``get_tracer_provider()`` costs
    microseconds when none is set."""
    api = _api if _api is not None else _otel()
    if not api:
        return False
    trace = api[0]
    provider = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is None:
        if not api[2]:
            return False
        provider = trace.get_tracer_provider()  # configured from the environment
    elif provider is _UNKNOWN:  # another API version: the public way
        provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider)


def span(
    name: str,
    attributes: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
    *,
    parent: Mapping[str, str] | None = None,
) -> contextlib.AbstractContextManager[Any]:
    """A context manager that records span *name* (the current span's child, or
    *parent*'s: trace-context headers), with *attributes* (or what a callable of them
    returns, called only when recording); an exception leaving it is recorded on the
    span. A no-op when nothing records."""
    if not recording():
        return _NO_SPAN
    trace, propagate, _ = _api
    if callable(attributes):
        attributes = attributes()
    context = propagate.extract(dict(parent)) if parent else None
    tracer = trace.get_tracer(TRACER_NAME)
    return tracer.start_as_current_span(name, context=context, attributes=_clean(attributes))


def current_headers() -> dict[str, str]:
    """The current trace context as W3C headers (``{}`` when none or not recording)."""
    if not recording():
        return {}
    carrier: dict[str, str] = {}
    _api[1].inject(carrier)
    return carrier


def start_headers(workflow: str, coordination_id: str) -> dict[str, str]:
    """At a run's start: the trace context its seed keeps (``{}`` when not recording):
    the current span's, or when there is none, a ``flowwarden.workflow.start`` span's
    (so every execution of the run joins one trace)."""
    if not recording():
        return {}
    trace = _api[0]
    if trace.get_current_span().get_span_context().is_valid:
        return current_headers()
    attributes = {"flowwarden.workflow": workflow, "flowwarden.coordination_id": coordination_id}
    with span("flowwarden.workflow.start", attributes):
        return current_headers()


def seed_metadata(headers: Mapping[str, str]) -> dict[str, str]:
    """The seed snapshot's metadata that keeps *headers*."""
    if not headers:
        return {}
    return {TRACE_CONTEXT: json.dumps(dict(headers), separators=(",", ":"))}


def headers_of(metadata: Mapping[str, str]) -> dict[str, str]:
    """The trace-context headers *metadata* keeps (``{}`` when none or unreadable)."""
    found = json_object(metadata, TRACE_CONTEXT) or {}
    return {str(k): str(v) for k, v in found.items() if k in ("traceparent", "tracestate")}


class HeadersCache:
    """The trace context of recent runs, by coordination id (a run's does not
    change: its seed keeps it), so an in-process run reads its seed once."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._found: OrderedDict[str, dict[str, str]] = OrderedDict()
        self._lock = Lock()

    def get(self, key: str) -> dict[str, str] | None:
        with self._lock:
            found = self._found.get(key)
            if found is not None:
                self._found.move_to_end(key)
            return found

    def put(self, key: str, headers: dict[str, str]) -> None:
        with self._lock:
            self._found[key] = headers
            self._found.move_to_end(key)
            while len(self._found) > self.size:
                self._found.popitem(last=False)


def event_attributes(spec: Any, operation: str) -> dict[str, Any]:
    """The attributes of a stream event's span."""
    return {"flowwarden.stream": spec.name, "flowwarden.stream.operation": operation}


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not attributes:
        return None
    return {k: v for k, v in attributes.items() if v is not None}
