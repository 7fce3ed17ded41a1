"""Prometheus metrics of workflow runs, for
:class:`~flowwarden_django.integrations.prometheus.FlowwardenCollector`.

* **Run gauges**, read at scrape time from every database a defined workflow keeps its
  runs in (one grouped query each): ``flowwarden_workflow_runs{workflow, status}``, the
  runs in each status that is not final (running, waiting for an approval, a message,
  a timer, children or a queue slot, hibernated, failed, needing an upgrade), and
  ``flowwarden_workflow_oldest_wait_seconds{workflow, status}``, how long the oldest
  paused run of each waiting status has waited (since its record last changed: when
  it paused).
* **The step-duration histogram** ``flowwarden_workflow_step_duration_seconds{workflow,
  step, outcome}``, fed by the engine's ``step_attempted`` signal in the process that
  runs the step (a Celery or Temporal worker: scrape it, as the stream counters).

Labels are workflow and step names and fixed values: no run id becomes a label.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.db.models import Count, Min
from django.utils import timezone
from prometheus_client import Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from ..workflows.engine.signals import step_attempted
from ..workflows.runs.status import RunStatus
from .prometheus_queues import read_or_down

#: The statuses counted: every status but the final ones.
COUNTED = (RunStatus.RUNNING, *RunStatus.PAUSED, RunStatus.FAILED, RunStatus.NEEDS_UPGRADE)
#: The statuses whose oldest run's wait is reported.
WAITING = RunStatus.PAUSED

RUNS = "flowwarden_workflow_runs"
OLDEST_WAIT = "flowwarden_workflow_oldest_wait_seconds"
UP = "flowwarden_workflow_status_up"

#: Seconds (prometheus-client's default bounds, and longer ones for slow steps).
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)


def run_families() -> dict[str, Any]:
    """Fresh, empty families of the run gauges, by name."""
    labels = ["workflow", "status"]
    return {
        RUNS: GaugeMetricFamily(
            RUNS, "Workflow runs by status (final ones not counted).", labels=labels
        ),
        OLDEST_WAIT: GaugeMetricFamily(
            OLDEST_WAIT, "Seconds the oldest paused run of the status has waited.", labels=labels
        ),
        UP: GaugeMetricFamily(UP, "1 when the workflow runs could be read.", labels=[]),
    }


def _count_runs(
    databases: list[str],
) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], datetime]]:
    """The unfinished runs of *databases* by (workflow, status), and when the oldest
    paused run of each waiting status last changed."""
    from ..common.app_models import models

    counts: dict[tuple[str, str], int] = defaultdict(int)
    oldest: dict[tuple[str, str], datetime] = {}
    for db in databases:
        rows = (
            models.WorkflowRun.objects.using(db)
            .filter(status__in=COUNTED)
            .order_by()
            .values_list("workflow_name", "status")
            .annotate(runs=Count("pk"), since=Min("updated_at"))
        )
        for workflow, status, runs, since in rows:
            key = (workflow, status)
            counts[key] += runs
            if status in WAITING and since is not None:
                oldest[key] = min(since, oldest.get(key, since))
    return counts, oldest


def collect_runs(now: datetime | None = None) -> Iterator[Metric]:
    """The run gauges as of *now* (nothing while no workflow is defined)."""
    from ..workflows.definition.databases import workflow_databases

    databases = list(workflow_databases())
    if not databases:
        return
    now = now or timezone.now()
    families = run_families()
    found = read_or_down(families, UP, "the workflow runs", lambda: _count_runs(databases))
    if found is None:
        yield families[UP]
        return
    counts, oldest = found
    for (workflow, status), runs in sorted(counts.items()):
        families[RUNS].add_metric([workflow, status], runs)
    for (workflow, status), since in sorted(oldest.items()):
        families[OLDEST_WAIT].add_metric([workflow, status], max((now - since).total_seconds(), 0))
    yield from families.values()


class StepMetrics:
    """The step-duration histogram of this process, fed by ``step_attempted``."""

    def __init__(self) -> None:
        self.step_duration = Histogram(
            "flowwarden_workflow_step_duration_seconds",
            "Duration of step attempts run in this process (outcome: ok or the error class).",
            ["workflow", "step", "outcome"],
            buckets=STEP_BUCKETS,
            registry=None,
        )

    def observe(self, *, workflow: str, step: str, duration: float, error: str, **_: Any) -> None:
        """A ``step_attempted`` receiver."""
        self.step_duration.labels(workflow, step, error or "ok").observe(duration)

    def connect(self) -> None:
        """Receive ``step_attempted`` (once per process)."""
        step_attempted.connect(
            self.observe, weak=False, dispatch_uid="flowwarden_django.prometheus.steps"
        )


#: This process's step metrics (connected when ``integrations.prometheus`` is imported).
step_metrics = StepMetrics()
