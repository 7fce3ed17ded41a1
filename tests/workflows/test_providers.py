"""Execution providers: selection by ``FLOWWARDEN["WORKFLOW_EXECUTION"]``, the health
check with a logged fallback to in-process, and a step-per-task provider built on
``seed`` / ``run_local(max_steps=1)`` / ``Workflow.for_coordination``."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from flowwarden_django.workflows import (
    Completed,
    ExecutionProvider,
    Hibernated,
    InProcessProvider,
    Running,
    RunStatus,
    Workflow,
    advance,
    done,
    hibernate,
    resolve_provider,
    step,
    workflow_registry,
)
from flowwarden_django.workflows.backends.memory import InMemorySnapshotStore
from flowwarden_django.workflows.definition.metadata import LAST_STEP
from flowwarden_django.workflows.execution.providers import (
    InvalidExecutionProviderError,
    configured_provider,
    reset_providers,
)

HERE = __name__


class Recording(ExecutionProvider):
    """Runs in-process, and records what it was asked; availability is switchable."""

    name = "recording"
    available: Any = True
    calls: list[tuple[str, Any, Any]] = []

    def is_available(self) -> bool:
        if isinstance(Recording.available, Exception):
            raise Recording.available
        return bool(Recording.available)

    def run(self, workflow: Workflow, initial_state: Any = None, input: Any = None) -> Any:
        Recording.calls.append((workflow.coordination_id, initial_state, input))
        return workflow.run_local(initial_state, input)


class Queued(ExecutionProvider):
    """An asynchronous provider like the Celery one: persist the seed, queue one task
    per step, each task rebuilds the workflow from the run record."""

    name = "queued"
    tasks: list[tuple[str, Any]] = []

    def run(self, workflow: Workflow, initial_state: Any = None, input: Any = None) -> Any:
        head = workflow.seed(initial_state)
        Queued.tasks.append((workflow.coordination_id, input))
        return Running(head.state, workflow.coordination_id, head.metadata[LAST_STEP])

    @classmethod
    def drain(cls) -> list[Any]:
        """Run the queued tasks like a worker would; return each task's result."""
        results = []
        while cls.tasks:
            cid, task_input = cls.tasks.pop(0)
            result = Workflow.for_coordination(cid).run_local(input=task_input, max_steps=1)
            results.append(result)
            if isinstance(result, Running):  # more steps: queue the next one
                cls.tasks.append((cid, None))
        return results


class NotAProvider:
    pass


@pytest.fixture(autouse=True)
def _fresh_providers() -> Iterator[None]:
    reset_providers()
    Recording.available = True
    Recording.calls = []
    Queued.tasks = []
    yield
    reset_providers()


def execution(value: Any) -> Any:
    return override_settings(FLOWWARDEN={"WORKFLOW_EXECUTION": value})


def steps() -> list[Any]:
    @step("a")
    def a(state: str) -> Any:
        return advance(state + ":a")

    @step("b")
    def b(state: str) -> Any:
        return hibernate(state + ":b")

    @step("c")
    def c(state: str, ctx: Any) -> Any:
        return done(f"{state}:c={ctx.input}")

    return [a, b, c]


def test_the_default_is_in_process() -> None:
    assert isinstance(resolve_provider(), InProcessProvider)
    assert resolve_provider().name == "inprocess"
    with execution("inprocess"):
        assert isinstance(resolve_provider(), InProcessProvider)


def test_a_dotted_path_selects_a_provider_that_runs_the_workflow(db: Any) -> None:
    with execution(f"{HERE}.Recording"):
        provider = resolve_provider()
        assert isinstance(provider, Recording)
        assert resolve_provider() is provider  # one instance per setting value
        cid = uuid.uuid4().hex
        wf = Workflow("w", cid, steps(), InMemorySnapshotStore())
        assert wf.run("s") == Hibernated("s:a:b", cid, "b")
        assert wf.resume(input="yes") == Completed("s:a:b:c=yes", cid)
    assert Recording.calls == [(cid, "s", None), (cid, None, "yes")]


def test_an_unavailable_provider_falls_back_to_in_process_and_logs_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    Recording.available = False
    with execution(f"{HERE}.Recording"), caplog.at_level(logging.DEBUG, "flowwarden_django"):
        assert isinstance(resolve_provider(), InProcessProvider)
        assert isinstance(resolve_provider(), InProcessProvider)
        Recording.available = True
        assert isinstance(resolve_provider(), Recording)

    levels = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert levels == [
        (
            logging.WARNING,
            "workflow execution provider 'recording' is not available; "
            "running workflows in-process instead",
        ),
        (
            logging.DEBUG,
            "workflow execution provider 'recording' is not available; "
            "running workflows in-process instead",
        ),
        (logging.WARNING, "workflow execution provider 'recording' is available again"),
    ]


def test_a_failing_health_check_falls_back_too(caplog: pytest.LogCaptureFixture) -> None:
    Recording.available = ConnectionRefusedError("broker down")
    with execution(f"{HERE}.Recording"), caplog.at_level(logging.WARNING, "flowwarden_django"):
        assert isinstance(resolve_provider(), InProcessProvider)
    assert "failed its health check (ConnectionRefusedError('broker down'))" in caplog.text


def test_a_fallback_run_is_executed_in_process(db: Any) -> None:
    Recording.available = False
    with execution(f"{HERE}.Recording"):
        cid = uuid.uuid4().hex
        assert Workflow("w", cid, steps()[:1], InMemorySnapshotStore()).run("s") == Completed(
            "s:a", cid
        )
    assert Recording.calls == []


def test_with_the_fallback_refused_an_unreachable_provider_runs_nothing_here(
    transactional_db: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """``WORKFLOW_FALLBACK_TO_INPROCESS = False``: ``run()`` raises and writes nothing;
    ``start()`` records the run (the sweep continues it later) and runs no step."""
    from django.core.checks import run_checks

    from flowwarden_django.models import WorkflowRun
    from flowwarden_django.workflows import ExecutionUnavailableError

    Recording.available = False
    refused = {"WORKFLOW_EXECUTION": f"{HERE}.Recording", "WORKFLOW_FALLBACK_TO_INPROCESS": False}
    name = f"fw-refused-{uuid.uuid4().hex[:6]}"
    definition = Workflow.define(name, steps()[:1], InMemorySnapshotStore())
    try:
        with override_settings(FLOWWARDEN=refused):
            reset_providers()
            cid = uuid.uuid4().hex
            with pytest.raises(ExecutionUnavailableError, match="not running it in this process"):
                definition.workflow(cid).run("s")
            assert not WorkflowRun.objects.filter(pk=cid).exists()
            with caplog.at_level(logging.WARNING, "flowwarden_django"):
                started = Workflow.start(name, "s")
            assert started.created and isinstance(started.result, Running)
            assert WorkflowRun.objects.get(pk=started.coordination_id).status == RunStatus.RUNNING
            assert "was started but not run" in caplog.text
            assert Recording.calls == []
            assert not [
                m
                for m in run_checks(include_deployment_checks=True, databases=[])
                if m.id == "flowwarden_django.W203"
            ]
        with override_settings(FLOWWARDEN={"WORKFLOW_EXECUTION": f"{HERE}.Recording"}):
            (warning,) = [
                m
                for m in run_checks(include_deployment_checks=True, databases=[])
                if m.id == "flowwarden_django.W203"
            ]
            assert "WORKFLOW_FALLBACK_TO_INPROCESS" in warning.hint
    finally:
        workflow_registry.unregister(name)
        reset_providers()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("nonsense", "'nonsense' cannot be imported.*use one of: inprocess, celery"),
        ("no.such.Module", "'no.such.Module' cannot be imported"),
        (f"{HERE}.NotAProvider", "is not an ExecutionProvider subclass"),
    ],
)
def test_a_setting_naming_no_provider_is_a_configuration_error(value: str, message: str) -> None:
    with execution(value), pytest.raises(InvalidExecutionProviderError, match=message):
        configured_provider()


def test_a_provider_instance_can_be_configured() -> None:
    provider = Recording()
    with execution(provider):
        assert resolve_provider() is provider


@pytest.mark.django_db(transaction=True)
def test_a_step_per_task_provider_runs_one_step_per_task() -> None:
    definition = Workflow.define("queued", steps(), InMemorySnapshotStore())
    try:
        with execution(f"{HERE}.Queued"):
            started = Workflow.start("queued", "s", idempotency_key="evt-queued")
            cid = started.coordination_id
            assert started.result == Running("s", cid, "")
            assert definition.workflow(cid).status() == RunStatus.RUNNING

            assert Queued.drain() == [Running("s:a", cid, "a"), Hibernated("s:a:b", cid, "b")]
            assert definition.workflow(cid).status() == RunStatus.HIBERNATED

            assert definition.workflow(cid).resume(input="ok") == Running("s:a:b", cid, "b")
            assert Queued.drain() == [Completed("s:a:b:c=ok", cid)]
            assert definition.workflow(cid).status() == RunStatus.COMPLETED
            again = Workflow.start("queued", "s", idempotency_key="evt-queued")
            assert (again.created, Queued.tasks) == (False, [])
    finally:
        workflow_registry.unregister("queued")
