"""Checks of the workflow queues: ``FLOWWARDEN["WORKFLOW_QUEUES"]`` (E205), a workflow
that declares a queue the setting lacks (W206) and runs that wait for a slot of such a
queue (W207). ``WORKFLOW_QUEUE_STALE_AFTER`` is a duration like the others (E010)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core import checks
from django.db.models import Count

from ..conf import SETTING_NAME
from .workflows import readable_runs_database

SETTING = f'{SETTING_NAME}["WORKFLOW_QUEUES"]'
QUEUES_HINT = (
    'Give each queue a dict of options, with at least one limit: {"carrier-api": '
    '{"concurrency": 5, "worker_concurrency": 2, "rate": "100/m", "priority": True}}. '
    "concurrency and worker_concurrency are whole numbers from 1 to 10000, rate is "
    '"N/s", "N/m", "N/h", "N/d" or "N/<duration>" ("10/30s"), priority and '
    'partitioned are True or False, scope is "steps" or "runs".'
)

#: Options of other tools' queues (DBOS, Celery) and what this one calls them.
OPTION_ALIASES = {
    "limiter": "rate",
    "rate_limit": "rate",
    "max_concurrency": "concurrency",
    "worker_concurrency_limit": "worker_concurrency",
    "priority_enabled": "priority",
}


def _configured_queues() -> Any:
    configured = getattr(settings, SETTING_NAME, {})
    if not isinstance(configured, Mapping):
        return None
    return configured.get("WORKFLOW_QUEUES", {})


@checks.register()
def check_workflow_queues(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E205 for each problem of ``WORKFLOW_QUEUES``: not a dict, a queue name or
    options of the wrong form, an unknown option (with the nearest known one), a bad
    limit or rate, a queue with no limit."""
    from ..workflows.queues.settings import QUEUE_KEYS, build_queue

    queues = _configured_queues()
    if queues is None:
        return []
    if not isinstance(queues, dict):
        return [
            checks.Error(
                f"{SETTING} must be a dict of queue names to options, not {type(queues).__name__}.",
                hint=QUEUES_HINT,
                id="flowwarden_django.E205",
            )
        ]
    errors: list[checks.CheckMessage] = []
    for name, options in queues.items():
        unknown = (
            [key for key in options if key not in QUEUE_KEYS] if isinstance(options, dict) else []
        )
        for key in unknown:
            close = [OPTION_ALIASES[key]] if key in OPTION_ALIASES else []
            close = close or difflib.get_close_matches(str(key), QUEUE_KEYS, n=1, cutoff=0.6)
            errors.append(
                checks.Error(
                    f"{SETTING}[{name!r}] has an unknown option {key!r}: it would be ignored.",
                    hint=(
                        f'Did you mean "{close[0]}"?'
                        if close
                        else f"The options are: {', '.join(QUEUE_KEYS)}."
                    ),
                    id="flowwarden_django.E205",
                )
            )
        if unknown:
            continue
        try:
            build_queue(name, options)
        except ValueError as exc:
            errors.append(
                checks.Error(
                    f"{SETTING} is wrong: {exc}.", hint=QUEUES_HINT, id="flowwarden_django.E205"
                )
            )
    return errors


@checks.register()
def check_declared_queues(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W206 for each defined workflow version whose queue (``Workflow.define(...,
    queue=...)``) ``WORKFLOW_QUEUES`` does not configure: starting a run of it fails."""
    from ..workflows.definition.registry import workflow_registry

    queues = _configured_queues()
    if not isinstance(queues, dict):
        return []  # check_workflow_queues reports it
    warnings: list[checks.CheckMessage] = []
    for (name, version), queue in workflow_registry.declared_queues().items():
        if queue in queues:
            continue
        close = difflib.get_close_matches(queue, [str(q) for q in queues], n=1, cutoff=0.6)
        hint = f'Did you mean "{close[0]}"? ' if close else ""
        warnings.append(
            checks.Warning(
                f"Workflow {name!r} (version {version}) declares queue {queue!r}, which "
                f"{SETTING} does not configure: starting a run of it raises "
                "UnknownQueueError.",
                hint=hint + f'Add it to {SETTING} with its limits ({{{queue!r}: {{"concurrency": '
                "5}}), or name a configured queue in Workflow.define(..., queue=...).",
                id="flowwarden_django.W206",
            )
        )
    return warnings


@checks.register()
def check_runs_on_unknown_queues(
    app_configs: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """W207 for each queue that runs wait for a slot of (``waiting_slot``) and that
    ``WORKFLOW_QUEUES`` no longer configures: nothing admits them. One grouped query
    over the waiting runs (skipped as ``check_stranded_runs`` is: before ``migrate``,
    and when the caller names the databases checks may read without the runs' one)."""
    from django.db import DatabaseError

    from ..common.app_models import models
    from ..workflows.runs.status import RunStatus

    queues = _configured_queues()
    if not isinstance(queues, dict):
        return []
    runs_db = readable_runs_database(kwargs.get("databases"))
    if runs_db is None:
        return []
    try:
        waiting = list(
            models.WorkflowRun.objects.using(runs_db)
            .filter(status=RunStatus.WAITING_SLOT)
            .exclude(queue__in=list(queues))
            .values_list("queue")
            .annotate(n=Count("pk"))
            .order_by("queue")
        )
    except DatabaseError:
        return []
    command = "manage.py flowwarden_workflows cancel"
    return [
        checks.Warning(
            f"{count} run{'s' if count != 1 else ''} wait{'' if count != 1 else 's'} for a "
            f"slot of queue {queue!r}, which {SETTING} does not configure: nothing admits "
            "them.",
            hint=f"Configure the queue again (its runs then continue), or `{command}` them.",
            id="flowwarden_django.W207",
        )
        for queue, count in waiting
    ]
