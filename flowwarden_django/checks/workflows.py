"""Checks of the workflows: the execution provider (E202, W202; W203 with ``--deploy``),
``TEMPORAL`` (E203, E204), the runs on workflows or versions this code does not define
(W204, W205) and the Celery beat entries that start workflows (E210)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from importlib.util import find_spec
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from ..conf import SETTING_NAME, fw_settings


@checks.register()
def check_workflow_execution(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E202 when ``WORKFLOW_EXECUTION`` names no usable provider; W202 when it is the
    Celery provider and no Celery app is loaded: steps would be published with
    Celery's fallback app (amqp://localhost, queue "celery") that no worker may read."""
    from ..workflows.execution.providers import InvalidExecutionProviderError, configured_provider

    if not isinstance(getattr(settings, SETTING_NAME, {}), Mapping):
        return []
    try:
        provider = configured_provider()
    except InvalidExecutionProviderError as exc:
        return [
            checks.Error(
                str(exc),
                hint='Use "inprocess", "celery", "temporal" or the dotted path of an '
                "ExecutionProvider.",
                id="flowwarden_django.E202",
            )
        ]
    except ImproperlyConfigured as exc:
        if _uses_temporal():
            return []  # check_temporal names each problem of the TEMPORAL setting
        return [checks.Error(str(exc), id="flowwarden_django.E202")]
    if getattr(provider, "name", "") != "celery" or getattr(provider, "_app", None) is not None:
        return []
    from celery import _state

    if any(app.set_as_current for app in _state._get_active_apps()):
        return []
    return [
        checks.Warning(
            f'{SETTING_NAME}["WORKFLOW_EXECUTION"] is "celery", but no Celery app is loaded: '
            "workflow steps would be sent with Celery's default app, which no worker may read.",
            hint="Load your Celery app when Django starts, as Celery's Django guide does: "
            "in your project package's __init__.py, `from .celery import app as celery_app`.",
            id="flowwarden_django.W202",
        )
    ]


@checks.register(deploy=True)
def check_execution_fallback(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W203 (``check --deploy``): a remote provider is configured, and a run whose
    provider does not answer falls back to running its steps in the calling process
    (a web request, say)."""
    if not isinstance(getattr(settings, SETTING_NAME, {}), Mapping):
        return []
    execution = fw_settings.WORKFLOW_EXECUTION
    if execution in ("inprocess", None) or not fw_settings.WORKFLOW_FALLBACK_TO_INPROCESS:
        return []
    return [
        checks.Warning(
            f'{SETTING_NAME}["WORKFLOW_EXECUTION"] is {execution!r}, but when it does not '
            "answer, runs fall back to running their steps in the calling process (inside "
            "a web request, say).",
            hint=f'Set {SETTING_NAME}["WORKFLOW_FALLBACK_TO_INPROCESS"] = False to refuse '
            "(ExecutionUnavailableError; a started run is continued by the sweep later).",
            id="flowwarden_django.W203",
        )
    ]


def _uses_temporal() -> bool:
    value = getattr(settings, SETTING_NAME, {}).get("WORKFLOW_EXECUTION")
    return value == "temporal" or (
        isinstance(value, str) and value.startswith("flowwarden_django.integrations.temporal.")
    )


@checks.register()
def check_temporal(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E203 for each problem of ``FLOWWARDEN["TEMPORAL"]``; E204 when
    ``WORKFLOW_EXECUTION`` is ``"temporal"`` and temporalio is not installed."""
    from ..integrations.temporal.config import parse

    configured = getattr(settings, SETTING_NAME, {})
    if not isinstance(configured, Mapping):
        return []
    messages: list[checks.CheckMessage] = [
        checks.Error(
            problem,
            hint='See "Workflows on Temporal" in the README for the keys and their forms.',
            id="flowwarden_django.E203",
        )
        for problem in parse(configured.get("TEMPORAL"))[1]
    ]
    if _uses_temporal() and find_spec("temporalio") is None:
        messages.append(
            checks.Error(
                f'{SETTING_NAME}["WORKFLOW_EXECUTION"] is "temporal", but the Temporal SDK '
                "(temporalio) is not installed.",
                hint='pip install "flowwarden-django[temporal]"',
                id="flowwarden_django.E204",
            )
        )
    return messages


def readable_runs_database(databases: Collection[str] | None) -> str | None:
    """The runs' database, or ``None`` when checks may not read it: ``manage.py check``
    passes ``databases=None`` (every check runs); a caller that names the databases
    checks may use (the test runner, ``run_checks(databases=[])``) is obeyed."""
    from ..workflows.runs.records import RunRecords

    runs_db = RunRecords().db
    return runs_db if databases is None or runs_db in databases else None


@checks.register()
def check_stranded_runs(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W204 for each workflow version that unfinished runs are on and this code does
    not define (saying so when it defines no version of that workflow at all); W205
    for runs that stand after a step their defined version lacks. One grouped query
    of the run table (skipped while it cannot be read: before ``migrate``, without a
    database; and when the caller names the databases checks may read and the runs'
    database is not one of them)."""
    from django.db import DatabaseError

    from ..workflows.operations.versions import versions_in_use

    if readable_runs_database(kwargs.get("databases")) is None:
        return []
    try:
        in_use = versions_in_use()
    except DatabaseError:
        return []
    from ..workflows.definition.registry import workflow_registry

    command = "manage.py flowwarden_workflows"
    messages: list[checks.CheckMessage] = []
    for row in in_use:
        runs = f"{row.total} unfinished run{'s' if row.total != 1 else ''}"
        if not row.defined and not workflow_registry.versions(row.workflow):
            messages.append(
                checks.Warning(
                    f"{runs} of workflow {row.workflow!r}, which this process does not "
                    "define at all: this process cannot continue them (a decision made "
                    "here is recorded, but the run goes on only where the workflow is "
                    "defined).",
                    hint="Define it with Workflow.define() in an installed app's "
                    "workflows.py, which every process imports at start-up (the web "
                    "process, the workers, the commands); a workflow defined only in a "
                    f"shell is unknown elsewhere. If it is gone for good, `{command} "
                    "cancel` its runs.",
                    id="flowwarden_django.W204",
                )
            )
            continue
        if not row.defined:
            apply = (
                f"run `{command} upgrade` to apply the declared upgrade ({row.upgrade})"
                if row.upgrade
                else "or declare an upgrade from it (Workflow.define_upgrade) and run "
                f"`{command} upgrade`"
            )
            messages.append(
                checks.Warning(
                    f"{runs} of workflow {row.workflow!r} {'is' if row.total == 1 else 'are'} "
                    f"on version {row.version}, "
                    "which this code does not define: they cannot continue here.",
                    hint=f"Keep version {row.version} defined beside the new one until its "
                    f"runs finish, {apply}. `{command} versions` lists the versions in use.",
                    id="flowwarden_django.W204",
                )
            )
            continue
        missing = row.missing_steps()
        if missing:
            steps = ", ".join(f"{step!r} ({count})" for step, count in sorted(missing.items()))
            messages.append(
                checks.Warning(
                    f"Unfinished runs of version {row.version} of workflow {row.workflow!r} "
                    f"stand after steps this code's version {row.version} lacks: {steps}; "
                    "they would wait as needs_upgrade.",
                    hint="Give a changed definition a new version (Workflow.define(..., "
                    "version=N)) and keep the old one as it was, or declare an upgrade "
                    f"that maps those steps and run `{command} upgrade`.",
                    id="flowwarden_django.W205",
                )
            )
    return messages


@checks.register()
def check_scheduled_starts(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E210: an entry of the loaded Celery app's ``beat_schedule`` that starts workflows
    names no workflow, another schedule, or a state template that cannot format."""
    if find_spec("celery") is None:
        return []
    from celery import _state

    from ..workflows.operations.schedule_ticks import ScheduleError, check_state_template

    start_task = "flowwarden_django.start_scheduled_workflow"
    errors: list[checks.CheckMessage] = []
    for app in _state._get_active_apps():
        if not app.set_as_current:
            continue
        for name, entry in (app.conf.beat_schedule or {}).items():
            if not isinstance(entry, Mapping) or entry.get("task") != start_task:
                continue
            arguments = entry.get("kwargs") or {}
            headers = (entry.get("options") or {}).get("headers") or {}
            sent_name = arguments.get("schedule") or headers.get("periodic_task_name")
            problem = None
            if not isinstance(arguments.get("workflow"), str):
                problem = 'its kwargs name no "workflow"'
            elif sent_name != name:
                problem = f"its kwargs name the schedule {sent_name!r}, not {name!r}"
            else:
                try:
                    check_state_template(arguments.get("state"))
                except ScheduleError as exc:
                    problem = str(exc)
            if problem:
                errors.append(
                    checks.Error(
                        f"beat_schedule entry {name!r} cannot start its workflow: {problem}.",
                        hint="Make the entry with flowwarden_django.integrations.celery."
                        "schedules.beat_schedule_entry(), which checks it.",
                        id="flowwarden_django.E210",
                    )
                )
    return errors
