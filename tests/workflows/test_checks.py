"""System checks of the workflow execution setting: E202 and W202."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery
from celery import _state as celery_state
from django.test import override_settings

from flowwarden_django.checks import check_workflow_execution
from flowwarden_django.workflows.execution.providers import reset_providers


@pytest.fixture(autouse=True)
def fresh_providers() -> Iterator[None]:
    reset_providers()
    yield
    reset_providers()


def ids(messages: list) -> list[str]:
    return [message.id for message in messages]


def test_the_default_is_fine() -> None:
    assert check_workflow_execution() == []


@pytest.mark.parametrize("value", ["bogus", "os.path.join", "no.such.Provider"])
def test_e202_names_the_setting_and_the_choices(value: str) -> None:
    with override_settings(FLOWWARDEN={"WORKFLOW_EXECUTION": value}):
        messages = check_workflow_execution()
    assert ids(messages) == ["flowwarden_django.E202"]
    assert "WORKFLOW_EXECUTION" in messages[0].msg and "inprocess" in messages[0].hint


def test_w202_when_celery_is_chosen_but_no_app_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    fallback = Celery("default", set_as_current=False)
    monkeypatch.setattr(celery_state, "_get_active_apps", lambda: [fallback])
    with override_settings(FLOWWARDEN={"WORKFLOW_EXECUTION": "celery"}):
        messages = check_workflow_execution()
    assert ids(messages) == ["flowwarden_django.W202"]
    assert "from .celery import app as celery_app" in messages[0].hint


def test_no_warning_once_an_app_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    project = Celery("proj", set_as_current=False)
    project.set_as_current = True  # as a project's app is, without touching this thread
    monkeypatch.setattr(celery_state, "_get_active_apps", lambda: [project])
    with override_settings(FLOWWARDEN={"WORKFLOW_EXECUTION": "celery"}):
        assert check_workflow_execution() == []
