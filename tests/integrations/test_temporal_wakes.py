"""The Temporal workflow's and step activity's handling of a hostile ``wake`` signal,
without a server: a refused wake leaves the run's version as it was, and only the
wake input's own check is reported as ``INPUT_REFUSED``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("temporalio", reason="the Temporal integration needs temporalio")

from temporalio.exceptions import ApplicationError

from flowwarden_django.common.user_input import UserJSONError
from flowwarden_django.integrations.temporal import activities
from flowwarden_django.integrations.temporal import workflow as temporal_workflow
from flowwarden_django.integrations.temporal.messages import (
    INPUT_REFUSED,
    RunStart,
    StepRequest,
    Wake,
)


class LoopStopped(Exception):
    """Raised where the run loop would wait for the next wake."""


def test_a_refused_wake_leaves_the_runs_version_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def stop(*args: Any, **kwargs: Any) -> None:
        raise LoopStopped

    async def refused(*args: Any, **kwargs: Any) -> Any:
        raise temporal_workflow._WakeRefused

    monkeypatch.setattr(temporal_workflow.workflow, "wait_condition", stop)
    run = temporal_workflow.RunWorkflow()
    run._version = 1
    monkeypatch.setattr(run, "_step", refused)
    run._wakes.append(Wake(origin="run", input="a\x00b", version=7))
    with pytest.raises(LoopStopped):
        asyncio.run(run.run(RunStart("cid", "flow")))
    assert run._version == 1, "a refused wake's version stuck to the run"


def step_request(input: Any) -> StepRequest:
    return StepRequest(coordination_id="cid", workflow="flow", origin="run", input=input)


@pytest.mark.parametrize("hostile", ["a\x00b", "x" * 70_000])
def test_a_hostile_wake_input_is_refused_before_the_step(
    hostile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def must_not_run(request: StepRequest) -> Any:
        raise AssertionError("the step ran with a refused input")

    monkeypatch.setattr(activities, "_run_step", must_not_run)
    with pytest.raises(ApplicationError) as raised:
        activities.run_step(step_request(hostile))
    assert raised.value.type == INPUT_REFUSED and raised.value.non_retryable


def test_another_user_json_error_of_the_step_is_not_an_input_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ``UserJSONError`` from elsewhere in the step (its state, say) is no reason to
    drop the wake: it is not reported as ``INPUT_REFUSED``."""

    def fails(request: StepRequest) -> Any:
        raise UserJSONError("the state holds a NUL character", "json_bad_text")

    monkeypatch.setattr(activities, "_run_step", fails)
    with pytest.raises(UserJSONError):
        activities.run_step(step_request({"fine": True}))
