"""The workflows of the queue tests (in-process, Celery and Temporal workers import
them), and what the tests measure of their step log.

Each step of ``queued`` sleeps ``state["ms"]`` milliseconds and appends one line to
the file ``state["log"]``: its run, step, process, start and end (``time.time()``,
one clock for every process of the machine). With ``state["slow"]`` (``{"step": name,
"ms": n, "began": path}``) that step also appends a line to the file ``began`` as it
starts (a killed step leaves no other) and sleeps ``n`` ms the first time it runs."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import Any

from flowwarden_django.workflows import StepContext, Workflow, advance
from tests.support import step_log

NAME = "queued"


def _step(state: dict[str, Any], ctx: StepContext) -> Any:
    started = time.time()
    ms = state.get("ms", 0)
    slow = state.get("slow")
    began = slow and slow["step"] == ctx.step_name
    if began and step_log.record({"log": slow["began"]}, ctx, start=started) == 1:
        ms = slow["ms"]
    time.sleep(ms / 1000)
    step_log.append(state, ctx, start=started, end=time.time())
    return advance(state)


def one(state: dict[str, Any], ctx: StepContext) -> Any:
    return _step(state, ctx)


def two(state: dict[str, Any], ctx: StepContext) -> Any:
    return _step(state, ctx)


def three(state: dict[str, Any], ctx: StepContext) -> Any:
    return _step(state, ctx)


def define(store: Any = "default", *, using: str | None = None) -> Any:
    """Register workflow ``queued`` (three steps; its queue is each start's)."""
    return Workflow.define(NAME, [one, two, three], store, using=using)


def most_at_once(executions: Iterable[dict[str, Any]]) -> int:
    """The most steps of *executions* that ran at the same moment (start inclusive,
    end exclusive)."""
    edges = []
    for e in executions:
        edges.append((e["start"], 1))
        edges.append((e["end"], -1))
    edges.sort(key=lambda edge: (edge[0], edge[1]))  # an end before a start at one instant
    most = current = 0
    for _, change in edges:
        current += change
        most = max(most, current)
    return most


def most_starts_in(executions: Iterable[dict[str, Any]], window: float) -> int:
    """The most step starts of *executions* inside any window of *window* seconds."""
    starts = sorted(e["start"] for e in executions)
    most, first = 0, 0
    for last, at in enumerate(starts):
        while at - starts[first] >= window:
            first += 1
        most = max(most, last - first + 1)
    return most


@contextlib.contextmanager
def quiet_queues() -> Iterator[None]:
    """Forget the slot rows made before, and close the connections of the in-process
    dispatch threads afterwards (so the test databases can be dropped)."""
    from flowwarden_django.workflows.queues import dispatch, slots

    slots.forget_made()
    try:
        yield
    finally:
        slots.forget_made()
        dispatch.timer.clear()
        dispatch._pool.close_connections()
        dispatch.timer.clear()  # what the dispatch threads' last runs set
