"""One trace across a real Temporal worker: a run started inside a span of this
process, each step an activity in ``flowwarden_temporal_worker`` (which exports its
spans to a file), is the parent span, a run span per execution and a step span per
attempt, all of one trace."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("temporalio", reason="the Temporal tests need temporalio")
pytest.importorskip("opentelemetry.sdk", reason="the tracing tests need opentelemetry-sdk")

from django.db import connections
from django.test import override_settings
from opentelemetry import trace

from flowwarden_django.workflows.definition.registry import workflow_registry
from flowwarden_django.workflows.execution.providers import reset_providers
from tests.integrations.test_temporal import (  # noqa: F401
    DB,
    on_temporal,
    server,
    wait_for_status,
)
from tests.observability.trace_checks import assert_one_trace
from tests.support import temporal_workflows as flows
from tests.support.otel import OTEL_FILE, read_spans, recorded_spans, span_dict
from tests.support.temporal_procs import DevServer, TemporalWorker, worker_environment


@pytest.fixture(scope="module")
def queue() -> str:
    return f"fw-trace-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def spans_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("otel") / "worker-spans.jsonl"


@pytest.fixture(scope="module")
def worker(
    server: DevServer,  # noqa: F811
    queue: str,
    spans_file: Path,
    django_db_setup: Any,
    django_db_blocker: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[TemporalWorker]:
    with django_db_blocker.unblock():
        database = connections[DB].settings_dict
    env = {**worker_environment(server.target, queue, database), OTEL_FILE: str(spans_file)}
    process = TemporalWorker(env, tmp_path_factory.mktemp("worker") / "worker.log")
    yield process
    process.kill()


@on_temporal
def test_a_run_is_one_trace_across_the_temporal_worker(
    server: DevServer,  # noqa: F811
    queue: str,
    worker: TemporalWorker,
    spans_file: Path,
    tmp_path: Path,
) -> None:
    setting = {
        "WORKFLOW_EXECUTION": "temporal",
        "TEMPORAL": {"TARGET": server.target, "TASK_QUEUE": queue, "HEARTBEAT_TIMEOUT": "2s"},
    }
    reset_providers()
    definitions = flows.define_workflows(DB)
    try:
        with override_settings(FLOWWARDEN=setting), recorded_spans() as exporter:
            with trace.get_tracer("test").start_as_current_span("request"):
                started = definitions[flows.TWENTY].start({"log": str(tmp_path / "steps.log")})
            here = [span_dict(span) for span in exporter.get_finished_spans()]
            cid = started.coordination_id
            wait_for_status(cid, ("completed",), [worker, server])
    finally:
        for name in definitions:
            workflow_registry.unregister(name)
        reset_providers()
    (request,) = [span for span in here if span["name"] == "request"]
    spans = here + read_spans(spans_file)
    assert_one_trace(spans, request, cid, [f"s{i:02d}" for i in range(1, 21)])
