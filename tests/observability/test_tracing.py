"""OpenTelemetry spans in one process: a run started inside a span continues its trace
in every execution and step attempt, a failed attempt is recorded on its span, a run
started outside any trace gets one, a decision has its span, and nothing is recorded
(or written into the seed) without an SDK's provider."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace

from flowwarden_django.common import tracing
from flowwarden_django.workflows import Workflow, advance, approve, done, step
from flowwarden_django.workflows.backends.memory import InMemorySnapshotStore
from tests.support.otel import recorded_spans, span_dict
from tests.support.refund_workflow import define_refunds

pytestmark = pytest.mark.django_db

tries: dict[str, int] = {}


@step(max_retries=1, retry_delay=0)
def flaky(state: dict[str, Any], ctx: Any) -> Any:
    tries[ctx.coordination_id] = tries.get(ctx.coordination_id, 0) + 1
    if tries[ctx.coordination_id] == 1:
        raise LookupError("the first try fails")
    return advance(state)


@step
def finish(state: dict[str, Any]) -> Any:
    return done(state)


def by_name(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [span for span in spans if span["name"] == name]


def test_a_run_started_in_a_span_continues_its_trace_in_every_step_attempt() -> None:
    cid = f"traced-{uuid.uuid4().hex[:8]}"
    store = InMemorySnapshotStore()
    with recorded_spans() as exporter:
        with trace.get_tracer("test").start_as_current_span("request"):
            Workflow("traced", cid, [flaky, finish], store).run({"n": 1})
        spans = [span_dict(span) for span in exporter.get_finished_spans()]
    (request,) = by_name(spans, "request")
    assert {span["trace_id"] for span in spans} == {request["trace_id"]}
    (run,) = by_name(spans, "flowwarden.workflow.run")
    assert run["parent_id"] == request["span_id"]
    assert run["attributes"] == {
        "flowwarden.coordination_id": cid,
        "flowwarden.workflow": "traced",
        "flowwarden.workflow.version": 1,
    }
    steps = by_name(spans, "flowwarden.workflow.step")
    assert [
        (s["attributes"]["flowwarden.step"], s["attributes"]["flowwarden.attempt"]) for s in steps
    ] == [
        ("flaky", 1),
        ("flaky", 2),
        ("finish", 1),
    ]
    assert {s["parent_id"] for s in steps} == {run["span_id"]}
    failed, *succeeded = steps
    assert failed["status"] == "ERROR" and "exception" in failed["events"]
    assert {s["status"] for s in succeeded} == {"UNSET"}
    # The seed keeps the request's context for executions elsewhere and later.
    seed = store.list()[0]
    assert tracing.headers_of(seed.metadata)["traceparent"].split("-")[1] == request["trace_id"]


def test_a_later_execution_joins_the_trace_the_run_started_in() -> None:
    cid = f"traced-{uuid.uuid4().hex[:8]}"
    store = InMemorySnapshotStore()
    with recorded_spans() as exporter:
        with trace.get_tracer("test").start_as_current_span("request"):
            Workflow("traced", cid, [flaky, finish], store).run_local({"n": 1}, max_steps=1)
        # Another execution, outside the request (a worker, after a restart):
        Workflow("traced", cid, [flaky, finish], store).run_local()
        spans = [span_dict(span) for span in exporter.get_finished_spans()]
    (request,) = by_name(spans, "request")
    runs = by_name(spans, "flowwarden.workflow.run")
    assert len(runs) == 2
    assert {span["trace_id"] for span in spans} == {request["trace_id"]}
    # run_local wrote the seed inside its own execution: the later one continues under it.
    assert runs[0]["parent_id"] == request["span_id"]
    assert runs[1]["parent_id"] == runs[0]["span_id"]


def test_a_run_executed_outside_any_trace_is_one_trace() -> None:
    cid = f"traced-{uuid.uuid4().hex[:8]}"
    store = InMemorySnapshotStore()
    with recorded_spans() as exporter:
        Workflow("traced", cid, [flaky, finish], store).run_local({"n": 1}, max_steps=1)
        Workflow("traced", cid, [flaky, finish], store).run_local()
        spans = [span_dict(span) for span in exporter.get_finished_spans()]
    first, second = by_name(spans, "flowwarden.workflow.run")
    # The first execution's span is the root, and the seed keeps it for the next.
    assert {span["trace_id"] for span in spans} == {first["trace_id"]}
    assert first["parent_id"] is None and second["parent_id"] == first["span_id"]


@pytest.mark.django_db(transaction=True)
def test_a_run_started_outside_any_trace_gets_a_start_span() -> None:
    from flowwarden_django.workflows import workflow_registry

    name = f"started-{uuid.uuid4().hex[:6]}"
    definition = Workflow.define(name, [flaky, finish], InMemorySnapshotStore())
    try:
        with recorded_spans() as exporter:
            definition.start({"n": 1})
            spans = [span_dict(span) for span in exporter.get_finished_spans()]
    finally:
        workflow_registry.unregister(name)
    (start,) = by_name(spans, "flowwarden.workflow.start")
    assert start["parent_id"] is None
    assert {span["trace_id"] for span in spans} == {start["trace_id"]}
    runs = by_name(spans, "flowwarden.workflow.run")
    assert runs and {run["parent_id"] for run in runs} == {start["span_id"]}
    assert len(by_name(spans, "flowwarden.workflow.step")) == 3


@pytest.mark.django_db(transaction=True)
def test_a_decision_has_its_span(django_user_model: Any) -> None:
    from flowwarden_django.models import Approval

    alice = django_user_model.objects.create_user("alice")
    definition = define_refunds(f"refunds-{uuid.uuid4().hex[:6]}")
    try:
        with recorded_spans() as exporter:
            started = definition.start({"amount": 500})
            approval = Approval.objects.get(coordination_id=started.coordination_id)
            approve(approval.pk, alice, comment="fine")
            spans = [span_dict(span) for span in exporter.get_finished_spans()]
    finally:
        from flowwarden_django.workflows import workflow_registry

        workflow_registry.unregister(definition.name)
    (decide,) = by_name(spans, "flowwarden.approval.decide")
    assert decide["attributes"]["flowwarden.decision"] == "approved"
    assert decide["attributes"]["flowwarden.coordination_id"] == started.coordination_id
    assert decide["attributes"]["flowwarden.approval"] == str(approval.pk)


def test_nothing_is_recorded_or_kept_without_a_provider() -> None:
    assert not tracing.recording()
    store = InMemorySnapshotStore()
    with trace.get_tracer("test").start_as_current_span("request"):
        Workflow("untraced", "untraced-1", [finish], store).run({})
    assert tracing.TRACE_CONTEXT not in store.list()[0].metadata
