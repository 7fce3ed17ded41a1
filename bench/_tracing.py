"""What OpenTelemetry costs the engine's steps (``bench/workflow_steps.py
--tracing-rounds``), three ways in one process, each round running them back to back
in a rotating order:

* **absent**: the package behaves as without ``opentelemetry`` installed (its
  ``common.tracing`` told the API is not there: no import, no lookup);
* **API, no SDK**: ``opentelemetry-api`` installed and no tracer provider configured
  (the API's default, which records nothing): the check the package makes per
  execution and per step attempt, and nothing else;
* **SDK, no-op exporter**: an SDK ``TracerProvider`` whose span processor hands each
  ended span to an exporter that drops it: the spans' own cost (made, timed,
  attributed, ended), without any I/O.

Reported: the median of the rounds' ratios to *absent* (the target for "API, no SDK"
is at least 0.97) and the cost per step in microseconds.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def absent() -> Iterator[None]:
    from flowwarden_django.common import tracing

    saved = tracing._api
    tracing._api = False
    try:
        yield
    finally:
        tracing._api = saved


@contextlib.contextmanager
def api_only() -> Iterator[None]:
    from flowwarden_django.common import tracing

    tracing._api = None  # looked up again: found, with the API's default provider
    yield


@contextlib.contextmanager
def sdk_noop() -> Iterator[None]:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class Dropping(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Dropping()))
    saved = trace._TRACER_PROVIDER  # the API sets its global once: swapped for the bench
    trace._TRACER_PROVIDER = provider
    try:
        yield
    finally:
        trace._TRACER_PROVIDER = saved
        provider.shutdown()


MODES = {"absent": absent, "API, no SDK": api_only, "SDK, no-op exporter": sdk_noop}


def tracing_lines(measure: Callable[[], float], rounds: int) -> list[str]:
    """Run *measure* (a round of the engine: steps per second) under each mode,
    *rounds* times; the lines to print."""
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return ["tracing: opentelemetry-sdk is not installed (pip install opentelemetry-sdk)"]
    names = list(MODES)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for number in range(rounds):
        order = names[number % len(names) :] + names[: number % len(names)]
        for name in order:
            with MODES[name]():
                rates[name].append(measure())
    lines = []
    base = rates["absent"]
    for name in names:
        median = statistics.median(rates[name])
        line = f"tracing, {name}: {median:.0f} steps/s (median of {rounds} rounds)"
        if name != "absent":
            ratio = statistics.median(r / b for r, b in zip(rates[name], base, strict=True))
            cost = statistics.median(
                (1 / r - 1 / b) * 1e6 for r, b in zip(rates[name], base, strict=True)
            )
            line += f", ratio to absent {ratio:.3f}, {cost:+.1f} us per step"
            if name == "API, no SDK":
                line += " (target: ratio >= 0.97)"
        lines.append(line)
    return lines
