"""One trace across a real Celery worker: a run started inside a span of this process,
each step a task in the worker (which exports its spans to a file), is the parent span,
a run span per execution and a step span per attempt, all of one trace."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("celery", reason="the Celery tests need celery")
pytest.importorskip("opentelemetry.sdk", reason="the tracing tests need opentelemetry-sdk")

from opentelemetry import trace

from flowwarden_django.workflows import Workflow
from flowwarden_django.workflows.runs.status import RunStatus
from tests.integrations.test_celery_workflows import (  # noqa: F401
    SOLO,
    definitions,
    execution,
    new_state,
    on_servers,
    producer,
    provider,
    wait_for_status,
)
from tests.observability.trace_checks import assert_one_trace
from tests.support import celery_workflows as flows
from tests.support.otel import OTEL_FILE, read_spans, recorded_spans, span_dict


@on_servers
def test_a_run_is_one_trace_across_the_celery_worker(
    definitions: Any,  # noqa: F811
    provider: Any,  # noqa: F811
    start_worker: Any,
    tmp_path: Path,
) -> None:
    spans_file = tmp_path / "worker-spans.jsonl"
    worker = start_worker(SOLO, env={OTEL_FILE: str(spans_file)})
    state = new_state(tmp_path)
    with recorded_spans() as exporter:
        with trace.get_tracer("test").start_as_current_span("request"), execution(provider):
            started = Workflow.start(flows.THREE, state, idempotency_key=uuid.uuid4().hex)
        here = [span_dict(span) for span in exporter.get_finished_spans()]
    cid = started.coordination_id
    wait_for_status(definitions[flows.THREE].workflow(cid), RunStatus.COMPLETED, worker)
    (request,) = [span for span in here if span["name"] == "request"]
    spans = here + read_spans(spans_file)
    assert_one_trace(spans, request, cid, ["one", "two", "three"])
    assert {span["pid"] for span in spans if span["name"] == "flowwarden.workflow.step"} == {
        worker.proc.pid
    }
