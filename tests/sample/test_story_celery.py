"""The sample's story end to end, deployed like production: PostgreSQL, a Celery worker
on a Redis broker, the stream runner and the web server, each its own process.

Settings: ``tests/support/story_celery_settings.py`` (the sample's, on PostgreSQL with
``WORKFLOW_EXECUTION = "celery"``); worker: ``celery -A tests.support.story_celery_app``.
MongoDB is the scripted replica set, started in this process; the other processes
talk to it with the real pymongo driver (``FLOWWARDEN_MONGO_URL``). The story's acts
are ``tests/support/story_procs.py``'s, shared with ``test_story_temporal.py``.

1. ``migrate`` a fresh database; start the worker and ``runserver``; bootstrap the
   ``orders`` stream (``flowwarden_streams run --burst``).
2. Insert small orders and one large one into ``shop.orders``; the next burst mirrors
   them into ``Order`` and starts one ``order-approval`` run per order; the steps run
   in the worker. The small runs complete, the large one waits for an approval.
3. An approver in ``approvers`` approves it through the REST API (twice: the second
   call repeats the decision); the run resumes in the worker and completes, and its
   snapshot chain is seed -> review -> fulfil. Every step ran as one task in the worker.
4. Exactly once: the stream is reset to its bootstrap position
   (``flowwarden_checkpoints reset --seen-token``) and every insert is delivered
   again; no run, step, approval or task is added.
"""

from __future__ import annotations

import ast
import contextlib
import re
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("celery", reason="the story needs celery")
pytest.importorskip("redis", reason="the story needs redis-py")
pytest.importorskip("psycopg", reason="the story needs psycopg")
pytest.importorskip("rest_framework", reason="the story's API needs djangorestframework")

import redis

from tests.support.lanes import on_lane
from tests.support.services import SERVICES
from tests.support.story_celery_settings import BROKER_DB
from tests.support.story_procs import (
    ORDERS,
    SMALL_ORDERS,
    WORKFLOW,
    Service,
    Story,
    delete_queue_keys,
    story_on_postgres,
)

#: Each run is two step tasks: review, then fulfil (after the approval for the large one).
STEP_TASKS = 2 * ORDERS
STEP_SUCCEEDED = re.compile(
    r"Task flowwarden_django\.run_workflow_step\[[^\]]+\] succeeded in [\d.e-]+s: (\{.*\})"
)


def step_tasks(worker: Service, workflow: str = WORKFLOW) -> list[dict[str, Any]]:
    """What each step task of *workflow* the worker finished returned (``run_step``'s
    outcome)."""
    found = [ast.literal_eval(m.group(1)) for m in STEP_SUCCEEDED.finditer(worker.log())]
    return [task for task in found if task.get("workflow") == workflow]


@on_lane("postgres")
@on_lane("redis")
def test_the_sample_story_on_postgres_with_a_celery_worker(tmp_path: Path) -> None:
    started = time.monotonic()
    tag = uuid.uuid4().hex[:10]
    broker = SERVICES["redis"]
    queue = f"fw-story-{tag}"
    with contextlib.ExitStack() as cleanup:
        # Unwound last to first: the processes stop before the queue goes.
        redis_client = redis.Redis(host=broker.host, port=broker.port, db=BROKER_DB)
        cleanup.callback(redis_client.close)
        cleanup.callback(delete_queue_keys, redis_client, queue)
        env = {
            "DJANGO_SETTINGS_MODULE": "tests.support.story_celery_settings",
            "FLOWWARDEN_STORY_QUEUE": queue,
        }
        story = cleanup.enter_context(story_on_postgres(tmp_path, tag, env))
        summary = run_story(story, queue)
    print(f"\n{summary}, {time.monotonic() - started:.1f} s in all (with set-up and clean-up)")


def run_story(story: Story, queue: str) -> str:
    started = time.monotonic()
    story.migrate()

    # -- 1. the worker, the web server, the approver, the stream's bootstrap ---------------
    worker = story.start(
        "worker",
        "-m",
        "celery",
        "-A",
        "tests.support.story_celery_app",
        "worker",
        "-Q",
        queue,
        "-c",
        "2",
        "--loglevel",
        "INFO",
        f"--hostname=story-{story.tag}@%h",
        # Nothing to wait for from other workers: start at once.
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    )
    story.open_shop()
    story.wait(lambda: " ready." in worker.log(), "the worker to be ready")

    # -- 2. orders in MongoDB: one run each, the steps in the worker --------------------------
    story.take_orders()

    # -- 3. the approver approves through the API; the run resumes in the worker -----------
    story.approve_through_the_api()

    # Every step ran as one task in the worker: two per run, none dropped.
    tasks = step_tasks(worker)
    assert len(tasks) == STEP_TASKS, (
        f"the worker ran {len(tasks)} step tasks, not {STEP_TASKS}:\n{worker.describe(120)}"
    )
    per_run = Counter(task["coordination_id"] for task in tasks)
    assert len(per_run) == ORDERS and set(per_run.values()) == {2}, per_run
    assert Counter(task["status"] for task in tasks) == {
        "running": SMALL_ORDERS,
        "waiting": 1,
        "completed": ORDERS,
    }
    # The large order's reminders are its approval's (remind_every): no run of their own.
    assert step_tasks(worker, "approval-reminder") == []
    story_seconds = time.monotonic() - started

    # -- 4. exactly once: every insert delivered again starts nothing -------------------------
    story.redeliver_everything()
    again = step_tasks(worker)
    assert again == tasks, f"the redelivery ran step tasks:\n{worker.describe(120)}"

    code = worker.stop()
    assert code == 0, f"the worker's warm shutdown failed (code {code}):\n{worker.describe()}"
    return (
        f"sample story on Celery: {ORDERS} orders, {ORDERS} runs "
        f"({SMALL_ORDERS} automatic, 1 approved through the API), {len(tasks)} step tasks "
        f"in the worker, redelivery of {ORDERS} inserts started nothing; "
        f"story {story_seconds:.1f} s"
    )
