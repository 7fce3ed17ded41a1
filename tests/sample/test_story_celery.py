"""The sample's story end to end, deployed like production: PostgreSQL, a Celery worker
on a Redis broker, the stream runner and the web server, each its own process.

Settings: ``tests/story_settings.py`` (the sample's, on PostgreSQL with
``WORKFLOW_EXECUTION = "celery"``); worker: ``celery -A tests.story_celery_app``.
MongoDB is the scripted replica set, started in this process; the other processes
talk to it with the real pymongo driver (``FLOWWARDEN_MONGO_URL``).

1. ``migrate`` a fresh database; start the worker and ``runserver``; bootstrap the
   ``orders`` stream (``flowwarden_streams run --burst``).
2. Insert small orders and one large one into ``shop.orders``; the next burst mirrors
   them into ``Order`` and starts one ``order-approval`` run per order; the steps run
   in the worker. The small runs complete, the large one waits for an approval.
3. An approver in ``approvers`` approves it through the REST API (twice: the second
   call repeats the decision); the run resumes in the worker and completes, and its
   snapshot chain is seed -> review -> fulfil.
4. Exactly once: the stream is reset to its bootstrap position
   (``flowwarden_checkpoints reset --seen-token``) and every insert is delivered
   again; no run, step or approval is added.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import time
import urllib.error
import urllib.request
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

from flowwarden_django.testkit.scripted_mongo import ScriptedReplicaSet
from tests.lanes import on_lane
from tests.services import SERVICES
from tests.story_procs import (
    ROOT,
    Service,
    StoryDatabase,
    delete_queue_keys,
    free_port,
    listening,
    manage,
    wait_until,
)
from tests.story_settings import BROKER_DB

WORKFLOW = "order-approval"
SMALL_ORDERS = 20
LARGE_ORDER, LARGE_CENTS = SMALL_ORDERS + 1, 250_000
ORDERS = SMALL_ORDERS + 1
#: Each run is two step tasks: review, then fulfil (after the approval for the large one).
STEP_TASKS = 2 * ORDERS
WAIT = 60.0
APPROVER = "approver"
APPROVE_PATH = "/api/v1/approvals/{id}/approve/"
STEP_SUCCEEDED = re.compile(
    r"Task flowwarden_django\.run_workflow_step\[[^\]]+\] succeeded in [\d.e-]+s: (\{.*\})"
)
FALLBACK = "running workflows in-process instead"
MAKE_APPROVER = """
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from rest_framework.authtoken.models import Token
user = get_user_model().objects.create_user("approver")
user.groups.add(Group.objects.get_or_create(name="approvers")[0])
print("TOKEN=" + Token.objects.create(user=user).key)
"""


def key(order_id: int) -> str:
    return f"shop.orders:{order_id}"


def small_order(order_id: int) -> dict[str, Any]:
    return {
        "_id": order_id,
        "customer": f"c{order_id}",
        "status": "new",
        "total_cents": 1_000 + (order_id * 3_700) % 90_000,
    }


class Story:
    """The story's processes and queries."""

    def __init__(self, tmp_path: Path, db: StoryDatabase, env: dict[str, str], tag: str):
        self.tmp_path = tmp_path
        self.db = db
        self.env = env
        self.tag = tag
        self.services: list[Service] = []
        self.outputs: dict[str, str] = {}

    # -- processes --------------------------------------------------------------------

    def start(self, name: str, *args: str) -> Service:
        service = Service(name, args, self.env, self.tmp_path / f"{name}.log")
        self.services.append(service)
        return service

    def manage(self, *args: str) -> str:
        out = manage(*args, env=self.env)
        self.outputs[" ".join(args)] = out
        return out

    def burst(self) -> int:
        """Run the streams once to the end; the events the ``orders`` stream handled."""
        out = self.manage("flowwarden_streams", "run", "--burst")
        assert FALLBACK not in out, f"the stream ran a workflow in-process:\n{out}"
        found = re.search(r"orders: (\d+) events handled, stopped", out)
        assert found, out
        return int(found.group(1))

    def wait(self, condition: Any, what: Any) -> Any:
        return wait_until(condition, WAIT, what, self.services)

    def dump(self) -> None:
        """Print every log of the story (on failure)."""
        for service in self.services:
            print(service.describe(80))
        for command, out in self.outputs.items():
            print(f"--- manage.py {command} ---\n{out[-3000:]}")

    # -- the database -----------------------------------------------------------------

    def runs_by_status(self) -> dict[str, int]:
        rows = self.db.query(
            "SELECT status, count(*) FROM flowwarden_django_workflowrun "
            "WHERE workflow_name = %s GROUP BY status",
            [WORKFLOW],
        )
        return dict(rows)

    def run_of(self, order_id: int) -> tuple[str, str]:
        [(cid, status)] = self.db.query(
            "SELECT coordination_id, status FROM flowwarden_django_workflowrun "
            "WHERE idempotency_key = %s",
            [key(order_id)],
        )
        return cid, status

    def approvals(self) -> list[tuple[str, str, str]]:
        return [
            (str(pk), cid, status)
            for pk, cid, status in self.db.query(
                "SELECT id, coordination_id, status FROM flowwarden_django_approval"
            )
        ]

    def approval_events(self, approval_id: str) -> list[tuple[str, str]]:
        """The audit trail of an approval: (action, actor), oldest first."""
        return self.db.query(
            "SELECT action, actor FROM flowwarden_django_approvalevent "
            "WHERE approval_id = %s ORDER BY at, id",
            [approval_id],
        )

    def order_approval(self, order_id: int) -> str:
        [(approval,)] = self.db.query(
            "SELECT approval FROM shop_order WHERE order_id = %s", [order_id]
        )
        return approval

    def chain(self, cid: str) -> list[dict[str, Any]]:
        rows = self.db.query(
            "SELECT id, parent_id, seq, metadata, state FROM flowwarden_django_snapshotrecord "
            "WHERE coordination_id = %s ORDER BY seq",
            [cid],
        )
        return [
            {
                "id": pk,
                "parent": parent,
                "seq": seq,
                "step": json.loads(metadata)["workflow.lastStep"],
                "state": json.loads(state),
            }
            for pk, parent, seq, metadata, state in rows
        ]

    # -- the worker's log ----------------------------------------------------------------

    def step_tasks(self, worker: Service) -> list[dict[str, Any]]:
        """What each step task the worker finished returned (``run_step``'s outcome)."""
        return [ast.literal_eval(m.group(1)) for m in STEP_SUCCEEDED.finditer(worker.log())]


def post_json(url: str, token: str, body: dict[str, Any]) -> tuple[int, Any]:
    """POST *body* as JSON with token auth; the status and the decoded answer."""
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "Authorization": f"Token {token}",
            "Content-Type": "application/json",
            "Accept": "application/json",
        },
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


@on_lane("postgres")
@on_lane("redis")
def test_the_sample_story_on_postgres_with_a_celery_worker(tmp_path: Path) -> None:
    started = time.monotonic()
    tag = uuid.uuid4().hex[:10]
    pg, broker = SERVICES["postgres"], SERVICES["redis"]
    db = StoryDatabase(
        f"fw_story_{tag}",
        pg.host,
        pg.port,
        os.environ.get("FLOWWARDEN_TEST_POSTGRES_USER", "postgres"),
        os.environ.get("FLOWWARDEN_TEST_POSTGRES_PASSWORD", ""),
    )
    queue = f"fw-story-{tag}"
    with contextlib.ExitStack() as cleanup:
        # Unwound last to first: the processes stop before the queue and database go.
        redis_client = redis.Redis(host=broker.host, port=broker.port, db=BROKER_DB)
        cleanup.callback(redis_client.close)
        cleanup.callback(delete_queue_keys, redis_client, queue)
        db.create()
        cleanup.callback(db.drop)
        mongo = ScriptedReplicaSet().start()
        cleanup.callback(mongo.stop)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "DJANGO_SETTINGS_MODULE": "tests.story_settings",
            "FLOWWARDEN_STORY_DB_NAME": db.name,
            "FLOWWARDEN_STORY_QUEUE": queue,
            "FLOWWARDEN_MONGO_URL": mongo.uri,
        }
        story = Story(tmp_path, db, env, tag)
        cleanup.callback(lambda: [service.stop() for service in reversed(story.services)])
        try:
            summary = run_story(story, mongo, queue)
        except BaseException:
            story.dump()
            raise
    print(f"\n{summary}, {time.monotonic() - started:.1f} s in all (with set-up and clean-up)")


def run_story(story: Story, mongo: ScriptedReplicaSet, queue: str) -> str:
    started = time.monotonic()
    story.manage("migrate", "--noinput", "-v", "0")

    # -- 1. the worker, the web server, the approver, the stream's bootstrap ---------------
    worker = story.start(
        "worker",
        "-m",
        "celery",
        "-A",
        "tests.story_celery_app",
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
    port = free_port()
    web = story.start("runserver", "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload")
    made = story.manage("shell", "-c", MAKE_APPROVER)
    token = re.search(r"TOKEN=(\w+)", made).group(1)

    assert story.burst() == 0, "the first start only saves the stream's position"
    bootstrap = json.loads(story.manage("flowwarden_checkpoints", "show", "orders", "--json"))
    assert bootstrap["last_seen_token"], bootstrap
    story.wait(lambda: " ready." in worker.log(), "the worker to be ready")

    # -- 2. orders in MongoDB: one run each, the steps in the worker --------------------------
    for order_id in range(1, SMALL_ORDERS + 1):
        mongo.insert("shop", "orders", small_order(order_id))
    mongo.insert(
        "shop",
        "orders",
        {"_id": LARGE_ORDER, "customer": "acme", "status": "new", "total_cents": LARGE_CENTS},
    )
    assert story.burst() == ORDERS
    story.wait(
        lambda: story.runs_by_status() == {"completed": SMALL_ORDERS, "waiting": 1},
        lambda: (
            f"{SMALL_ORDERS} completed runs and 1 waiting; the runs by status are "
            f"{story.runs_by_status()}"
        ),
    )
    large_cid, status = story.run_of(LARGE_ORDER)
    assert status == "waiting"
    [(approval_id, cid, approval_status)] = story.approvals()
    assert (cid, approval_status) == (large_cid, "pending")
    assert story.order_approval(LARGE_ORDER) == "waiting"
    assert {story.order_approval(i) for i in range(1, SMALL_ORDERS + 1)} == {"not needed"}

    # -- 3. the approver approves through the API; the run resumes in the worker -----------
    story.wait(lambda: listening(port), f"runserver on port {port}")
    url = f"http://127.0.0.1:{port}{APPROVE_PATH.format(id=approval_id)}"
    body = {"comment": "ok", "payload": {"ship": "express"}}
    status, first = post_json(url, token, body)
    assert status == 200, (status, first)
    decided = {k: first.get(k) for k in ("id", "status", "decided_by", "comment", "payload")}
    assert decided == {
        "id": approval_id,
        "status": "approved",
        "decided_by": APPROVER,
        "comment": "ok",
        "payload": {"ship": "express"},
    }, first
    # The same decision again: the same answer, and nothing decided twice.
    assert post_json(url, token, body) == (200, first)

    story.wait(lambda: story.run_of(LARGE_ORDER)[1] == "completed", "the approved run to complete")
    assert story.order_approval(LARGE_ORDER) == "approved"
    assert story.approvals() == [(approval_id, large_cid, "approved")]
    assert story.approval_events(approval_id) == [
        ("requested", ""),
        ("approved", APPROVER),
        ("repeated", APPROVER),
    ]
    chain = story.chain(large_cid)
    assert [(s["seq"], s["step"]) for s in chain] == [(1, ""), (2, "review"), (3, "fulfil")]
    assert [s["parent"] for s in chain] == [None, chain[0]["id"], chain[1]["id"]]
    final = chain[-1]["state"]
    assert final["outcome"] == "fulfilled", final
    assert (final["decided_by"], final["comment"]) == (APPROVER, "ok"), final
    assert FALLBACK not in web.log(), web.describe()

    # Every step ran as one task in the worker: two per run, none dropped.
    tasks = story.step_tasks(worker)
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
    story_seconds = time.monotonic() - started

    # -- 4. exactly once: every insert delivered again starts nothing -------------------------
    seen = json.dumps(bootstrap["last_seen_token"])
    story.manage("flowwarden_checkpoints", "reset", "orders", "--seen-token", seen, "--yes")
    assert story.burst() == ORDERS, "the reset stream reads every insert again"
    time.sleep(1.0)  # a step task queued by the redelivery would be done by now
    assert story.runs_by_status() == {"completed": ORDERS}
    keys = story.db.query(
        "SELECT idempotency_key, count(*) FROM flowwarden_django_workflowrun "
        "WHERE workflow_name = %s GROUP BY idempotency_key",
        [WORKFLOW],
    )
    assert dict(keys) == {key(i): 1 for i in range(1, ORDERS + 1)}
    assert story.approvals() == [(approval_id, large_cid, "approved")]
    assert len(story.chain(large_cid)) == 3
    assert story.order_approval(LARGE_ORDER) == "approved"
    again = story.step_tasks(worker)
    assert again == tasks, f"the redelivery ran step tasks:\n{worker.describe(120)}"

    code = worker.stop()
    assert code == 0, f"the worker's warm shutdown failed (code {code}):\n{worker.describe()}"
    return (
        f"sample story on Celery: {ORDERS} orders, {ORDERS} runs "
        f"({SMALL_ORDERS} automatic, 1 approved through the API), {len(tasks)} step tasks "
        f"in the worker, redelivery of {ORDERS} inserts started nothing; "
        f"story {story_seconds:.1f} s"
    )
