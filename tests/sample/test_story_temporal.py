"""The sample's story end to end on Temporal, deployed like production: PostgreSQL, the
Temporal dev server, a ``flowwarden_temporal_worker``, the stream runner and the web
server, each its own process.

Settings: ``tests/support/story_temporal_settings.py`` (the sample's, on PostgreSQL with
``WORKFLOW_EXECUTION = "temporal"``, on the dev server and a task queue of this run);
worker: ``manage.py flowwarden_temporal_worker`` with those settings and its recovery
sweep on, as deployed. MongoDB is the scripted replica set, started in this process.
The story's acts are ``tests/support/story_procs.py``'s, shared with ``test_story_celery.py``.

1. ``migrate`` a fresh database; start the worker and ``runserver``; bootstrap the
   ``orders`` stream (``flowwarden_streams run --burst``).
2. Insert small orders and one large one into ``shop.orders``; the next burst mirrors
   them into ``Order`` and starts one ``order-approval`` run per order, each one
   Temporal workflow whose steps are activities in the worker. The small runs
   complete, the large one waits for an approval.
3. An approver in ``approvers`` approves it through the REST API over HTTP (twice: the
   second call repeats the decision); ``runserver`` wakes the run's Temporal workflow,
   the worker runs ``fulfil`` and the run completes; its snapshot chain is seed ->
   review -> fulfil. Every step ran once, as one activity in the worker; the server
   holds one completed workflow per run, the large one with two step activities.
4. Exactly once: the stream is reset to its bootstrap position and every insert is
   delivered again; no run, step, approval, activity or Temporal workflow is added.
   (This part does not depend on the provider; it is here because it is cheap.)
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("temporalio", reason="the story on Temporal needs temporalio")
pytest.importorskip("psycopg", reason="the story needs psycopg")
pytest.importorskip("rest_framework", reason="the story's API needs djangorestframework")

from flowwarden_django.integrations.temporal.messages import STEP_ACTIVITY, WAKE_SIGNAL
from tests.support.lanes import on_lane
from tests.support.story_procs import (
    ORDERS,
    SMALL_ORDERS,
    WORKFLOW,
    Story,
    story_on_postgres,
)
from tests.support.temporal_procs import DevServer, TemporalWorker, executions, history

STEP_DONE = re.compile(
    rf"workflow {WORKFLOW} \((?P<cid>[^)]+)\): step (?P<step>\S+) done "
    r"\(attempt (?P<attempt>\d+)\), run (?P<status>\w+)"
)


def steps_done(worker: TemporalWorker) -> list[dict[str, str]]:
    """The steps the worker's activities ran, as its log says, in order."""
    return [m.groupdict() for m in STEP_DONE.finditer(worker.log())]


@on_lane("postgres")
@pytest.mark.lane("temporal")
def test_the_sample_story_on_postgres_with_a_temporal_worker(tmp_path: Path) -> None:
    started = time.monotonic()
    tag = uuid.uuid4().hex[:10]
    queue = f"fw-story-{tag}"
    with contextlib.ExitStack() as cleanup:
        server = DevServer(tmp_path)
        server.start()
        cleanup.callback(server.stop)
        env = {
            "DJANGO_SETTINGS_MODULE": "tests.support.story_temporal_settings",
            "FLOWWARDEN_TEMPORAL_TARGET": server.target,
            "FLOWWARDEN_STORY_QUEUE": queue,
        }
        story = cleanup.enter_context(story_on_postgres(tmp_path, tag, env))
        story.watch(server)  # it must stay up; its log is printed on failure
        summary = run_story(story, server, queue)
    print(f"\n{summary}, {time.monotonic() - started:.1f} s in all (with set-up and clean-up)")


def run_story(story: Story, server: DevServer, queue: str) -> str:
    started = time.monotonic()
    story.migrate()

    # -- 1. the worker, the web server, the approver, the stream's bootstrap ---------------
    # Its recovery sweep on (no --no-recovery), as deployed: it must find nothing stalled.
    log = story.tmp_path / "worker.log"
    worker = story.watch(TemporalWorker(story.env, log, options=(), wait=False))
    story.open_shop()
    story.wait(worker.ready, "the worker to poll its task queue")

    # -- 2. orders in MongoDB: one run each, one Temporal workflow each ---------------------
    story.take_orders()

    # -- 3. the approver approves through the API; the run resumes in the worker -----------
    story.approve_through_the_api()

    # Every step ran once, as one activity in the worker: two per run, none retried.
    steps = steps_done(worker)
    assert len(steps) == 2 * ORDERS, (
        f"the worker ran {len(steps)} steps, not {2 * ORDERS}:\n{worker.describe(120)}"
    )
    per_run: dict[str, list[str]] = {}
    for done in steps:
        per_run.setdefault(done["cid"], []).append(done["step"])
    cids = {story.run_of(order_id)[0] for order_id in range(1, ORDERS + 1)}
    assert set(per_run) == cids and all(s == ["review", "fulfil"] for s in per_run.values())
    assert {done["attempt"] for done in steps} == {"1"}
    assert Counter(done["status"] for done in steps) == {
        "running": SMALL_ORDERS,
        "waiting": 1,
        "completed": ORDERS,
    }
    # The server's side: one workflow per run (its id the coordination id), completed.
    # (The large order's reminders are its approval's, remind_every: no run of their own.)
    expected = sorted((c, "COMPLETED") for c in cids)
    on_queue = f"TaskQueue = '{queue}'"
    story.wait(
        lambda: sorted(executions(server, on_queue)) == expected,
        lambda: f"{ORDERS} completed Temporal workflows; there are {executions(server, on_queue)}",
    )
    # The large run's workflow: two step activities (no expiry), and two wakes: the
    # stream's start, then the decision's (the repeated call woke nothing).
    events = history(server, story.large_cid)
    activities = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert activities == [STEP_ACTIVITY, STEP_ACTIVITY], activities
    signals = [
        (
            e.workflow_execution_signaled_event_attributes.signal_name,
            [
                json.loads(payload.data)
                for payload in e.workflow_execution_signaled_event_attributes.input.payloads
            ],
        )
        for e in events
        if e.HasField("workflow_execution_signaled_event_attributes")
    ]
    # Each wake says how to schedule the step it continues with (regular activities:
    # the shop's steps have no timeout and are not marked short).
    policy = {"max_retries": 0, "retry_delay": 0.1, "timeout": None, "local": False}
    # And the version of the run's workflow (a worker without it hands the step on).
    wake = {"origin": "run", "input": None, "policy": policy, "version": 1}
    assert signals == [(WAKE_SIGNAL, [wake])] * 2, signals
    assert "recovery sweep: woke" not in worker.log(), worker.describe(120)
    story_seconds = time.monotonic() - started

    # -- 4. exactly once: every insert delivered again starts nothing -------------------------
    story.redeliver_everything()
    assert steps_done(worker) == steps, f"the redelivery ran steps:\n{worker.describe(120)}"
    assert len(executions(server, on_queue)) == ORDERS

    code = worker.stop()
    assert code == 0, f"the worker's graceful shutdown failed (code {code}):\n{worker.describe()}"
    return (
        f"sample story on Temporal: {ORDERS} orders, {ORDERS} runs "
        f"({SMALL_ORDERS} automatic, 1 approved through the API), {len(steps)} step "
        f"activities in the worker, {ORDERS} completed Temporal workflows, redelivery of "
        f"{ORDERS} inserts started nothing; story {story_seconds:.1f} s"
    )
