"""The sample's story, deployed like production: its processes, servers and acts.

Used by ``tests/sample/test_story_celery.py`` and ``tests/sample/test_story_temporal.py``.
:class:`Service` is a long-running subprocess (a worker, ``runserver``) in a process
group of its own, logging to a file; :func:`manage` runs one ``manage.py`` command to
the end. :class:`StoryDatabase` creates and drops the story's PostgreSQL database,
:func:`delete_queue_keys` removes what a queue left in Redis.

:func:`story_on_postgres` sets a story up (a fresh database, the scripted MongoDB
replica set) and :class:`Story` plays its acts, whatever runs the workflow steps:
``migrate``; ``open_shop`` (``runserver``, an approver, the stream's bootstrap);
``take_orders`` (small orders and a large one mirrored, one ``order-approval`` run
each); ``approve_through_the_api`` (the large one approved over HTTP, the run
completed); ``redeliver_everything`` (every insert delivered again starts nothing).
The test of each provider starts its workers and checks what they ran.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from tests.support.services import SERVICES, free_port

ROOT = Path(__file__).resolve().parents[2]


def die_with_parent() -> None:
    """In the child: be SIGKILLed if the test process dies (Linux only)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Process(Protocol):
    """What a story watches: a :class:`Service`, or a server such as Temporal's."""

    def assert_alive(self) -> None: ...

    def describe(self, lines: int = 40) -> str: ...

    def stop(self) -> Any: ...


P = TypeVar("P", bound=Process)


def tail(text: str, lines: int = 40) -> str:
    """The last *lines* lines of *text*."""
    return "\n".join(text.splitlines()[-lines:]) or "(empty)"


class Service:
    """A subprocess that runs until stopped, in a session (process group) of its own,
    its stdout and stderr written to *log_path*."""

    def __init__(
        self,
        name: str,
        args: Sequence[str],
        env: dict[str, str],
        log_path: Path,
        wrap: Callable[[list[str]], list[str]] = list,
    ):
        self.name = name
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                wrap([sys.executable, *args]),  # wrap: NetworkNamespace.command, say
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: pool children included
                preexec_fn=die_with_parent,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def describe(self, lines: int = 40) -> str:
        """Its name, log file and log tail, for a failure message."""
        return f"--- {self.name} (log {self.log_path}) ---\n{tail(self.log(), lines)}"

    def assert_alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise AssertionError(f"{self.name} exited on its own (code {code}):\n{self.describe()}")

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM the process (a warm shutdown: it stops its own children), then
        SIGKILL its process group after *timeout*; the exit code (``None`` when it had
        to be killed). Safe to call again."""
        code = self.proc.poll()
        if code is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = self.proc.wait(timeout=timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # stragglers of the group
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        return code


def manage(*args: str, env: dict[str, str], timeout: float = 60.0) -> str:
    """Run ``manage.py *args*``; its stdout. Fails with its output when it fails."""
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise AssertionError(
            f"manage.py {' '.join(args)} failed (code {result.returncode}):\n"
            f"{tail(result.stdout)}\n{tail(result.stderr)}"
        )
    return result.stdout + result.stderr


def wait_until(
    condition: Callable[[], Any],
    timeout: float,
    what: str | Callable[[], str],
    services: Sequence[Process] = (),
    *,
    interval: float = 0.1,
) -> Any:
    """Poll *condition* until it returns something true (returned); fail with *what*
    (or what it returns, when a function) and the services' logs if one of them dies
    or *timeout* seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        for service in services:
            service.assert_alive()
        if time.monotonic() > deadline:
            logs = "\n".join(service.describe() for service in services)
            text = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {text}\n{logs}")
        time.sleep(interval)


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:*port*."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


class StoryDatabase:
    """A PostgreSQL database made for one story run (``create``) and dropped after it
    (``drop``), with an autocommit connection to query it (``query``)."""

    def __init__(self, name: str, host: str, port: int, user: str, password: str) -> None:
        self.name = name
        self._server = {"host": host, "port": port, "user": user, "password": password}
        self._connection: Any = None

    def _admin(self) -> Any:
        import psycopg

        return psycopg.connect(dbname="postgres", autocommit=True, **self._server)

    def create(self) -> None:
        with self._admin() as admin:
            admin.execute(f'CREATE DATABASE "{self.name}"')

    def drop(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        with self._admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of *sql* (each query sees everything committed before it)."""
        import psycopg

        if self._connection is None:
            self._connection = psycopg.connect(dbname=self.name, autocommit=True, **self._server)
        return self._connection.execute(sql, params).fetchall()


def delete_queue_keys(client: Any, queue: str) -> list[bytes]:
    """Delete every key of Redis database *client* whose name contains *queue* (the
    queue's list, its kombu binding, the unacked-message keys); the keys deleted."""
    keys = list(client.scan_iter(match=f"*{queue}*"))
    if keys:
        client.delete(*keys)
    return keys


# -- the story ------------------------------------------------------------------------------

WORKFLOW = "order-approval"
SMALL_ORDERS = 20
LARGE_ORDER, LARGE_CENTS = SMALL_ORDERS + 1, 250_000
ORDERS = SMALL_ORDERS + 1
WAIT = 60.0
APPROVER = "approver"
APPROVE_PATH = "/api/v1/approvals/{id}/approve/"
#: What a process logs when a workflow would run in it rather than on the provider.
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


@contextlib.contextmanager
def story_on_postgres(tmp_path: Path, tag: str, env: dict[str, str]) -> Iterator[Story]:
    """A :class:`Story` on a fresh PostgreSQL database ``fw_story_<tag>`` and the
    scripted MongoDB replica set; its processes run with this environment plus *env*
    (``DJANGO_SETTINGS_MODULE`` first of all). On the way out its processes stop, and
    the replica set and the database go; when the block fails, every log is printed."""
    from flowwarden_django.testkit.scripted_mongo import ScriptedReplicaSet

    pg = SERVICES["postgres"]
    db = StoryDatabase(
        f"fw_story_{tag}",
        pg.host,
        pg.port,
        os.environ.get("FLOWWARDEN_TEST_POSTGRES_USER", "postgres"),
        os.environ.get("FLOWWARDEN_TEST_POSTGRES_PASSWORD", ""),
    )
    with contextlib.ExitStack() as cleanup:
        # Unwound last to first: the processes stop before the database goes.
        db.create()
        cleanup.callback(db.drop)
        mongo = ScriptedReplicaSet().start()
        cleanup.callback(mongo.stop)
        story_env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "FLOWWARDEN_STORY_DB_NAME": db.name,
            "FLOWWARDEN_MONGO_URL": mongo.uri,
            **env,
        }
        story = Story(tmp_path, db, mongo, story_env, tag)
        cleanup.callback(story.stop)
        try:
            yield story
        except BaseException:
            story.dump()
            raise


class Story:
    """The story's processes, its acts and its queries."""

    def __init__(
        self, tmp_path: Path, db: StoryDatabase, mongo: Any, env: dict[str, str], tag: str
    ) -> None:
        self.tmp_path = tmp_path
        self.db = db
        self.mongo = mongo
        self.env = env
        self.tag = tag
        self.services: list[Process] = []
        self.outputs: dict[str, str] = {}
        # Set by the acts:
        self.web: Service | None = None
        self.port = 0
        self.token = ""
        self.bootstrap: dict[str, Any] = {}
        self.approval_id = ""
        self.large_cid = ""

    # -- processes --------------------------------------------------------------------

    def start(self, name: str, *args: str) -> Service:
        """Start ``python *args*`` with the story's environment (stopped at the end)."""
        return self.watch(Service(name, args, self.env, self.tmp_path / f"{name}.log"))

    def watch(self, process: P) -> P:
        """Watch *process* from now on: it must stay alive while the story waits, its log
        is printed on failure, and it is stopped at the end (before those started earlier)."""
        self.services.append(process)
        return process

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop()

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

    # -- the acts -----------------------------------------------------------------------

    def migrate(self) -> None:
        self.manage("migrate", "--noinput", "-v", "0")

    def open_shop(self) -> None:
        """Start ``runserver``, make the approver (its API token), and bootstrap the
        ``orders`` stream: its first run only saves its position."""
        self.port = free_port()
        self.web = self.start(
            "runserver", "manage.py", "runserver", f"127.0.0.1:{self.port}", "--noreload"
        )
        made = self.manage("shell", "-c", MAKE_APPROVER)
        self.token = re.search(r"TOKEN=(\w+)", made).group(1)
        assert self.burst() == 0, "the first start only saves the stream's position"
        self.bootstrap = json.loads(
            self.manage("flowwarden_checkpoints", "show", "orders", "--json")
        )
        assert self.bootstrap["last_seen_token"], self.bootstrap

    def take_orders(self) -> None:
        """Small orders and a large one in ``shop.orders``: the next burst mirrors them
        and starts one run each; the small runs complete, the large one waits."""
        for order_id in range(1, SMALL_ORDERS + 1):
            self.mongo.insert("shop", "orders", small_order(order_id))
        self.mongo.insert(
            "shop",
            "orders",
            {"_id": LARGE_ORDER, "customer": "acme", "status": "new", "total_cents": LARGE_CENTS},
        )
        assert self.burst() == ORDERS
        self.wait(
            lambda: self.runs_by_status() == {"completed": SMALL_ORDERS, "waiting": 1},
            lambda: (
                f"{SMALL_ORDERS} completed runs and 1 waiting; the runs by status are "
                f"{self.runs_by_status()}"
            ),
        )
        self.large_cid, status = self.run_of(LARGE_ORDER)
        assert status == "waiting"
        [(self.approval_id, cid, approval_status)] = self.approvals()
        assert (cid, approval_status) == (self.large_cid, "pending")
        assert self.order_approval(LARGE_ORDER) == "waiting"
        assert {self.order_approval(i) for i in range(1, SMALL_ORDERS + 1)} == {"not needed"}

    def approve_through_the_api(self) -> None:
        """The approver approves the large order over HTTP (twice: the second call repeats
        the decision); the run resumes and completes: seed -> review -> fulfil."""
        self.wait(lambda: listening(self.port), f"runserver on port {self.port}")
        url = f"http://127.0.0.1:{self.port}{APPROVE_PATH.format(id=self.approval_id)}"
        # The sample's decision form: an amount up to the order's total, and a reason.
        form = {"approved_amount": "1000.00", "reason": "credit_checked"}
        body = {"comment": "ok", "payload": form}
        status, first = post_json(url, self.token, body)
        assert status == 200, (status, first)
        decided = {k: first.get(k) for k in ("id", "status", "decided_by", "comment", "payload")}
        assert decided == {
            "id": self.approval_id,
            "status": "approved",
            "decided_by": APPROVER,
            "comment": "ok",
            "payload": form,  # the form's cleaned data
        }, first
        # The same decision again: the same answer, and nothing decided twice.
        assert post_json(url, self.token, body) == (200, first)

        self.wait(
            lambda: self.run_of(LARGE_ORDER)[1] == "completed", "the approved run to complete"
        )
        assert self.order_approval(LARGE_ORDER) == "approved"
        assert self.approvals() == [(self.approval_id, self.large_cid, "approved")]
        assert self.approval_events(self.approval_id) == [
            ("requested", ""),
            ("approved", APPROVER),
            ("repeated", APPROVER),
        ]
        chain = self.chain(self.large_cid)
        assert [(s["seq"], s["step"]) for s in chain] == [(1, ""), (2, "review"), (3, "fulfil")]
        assert [s["parent"] for s in chain] == [None, chain[0]["id"], chain[1]["id"]]
        final = chain[-1]["state"]
        assert final["outcome"] == "fulfilled", final
        assert (final["decided_by"], final["comment"]) == (APPROVER, "ok"), final
        assert self.web is not None
        assert FALLBACK not in self.web.log(), self.web.describe()

    def redeliver_everything(self) -> None:
        """Exactly once: the stream reset to its bootstrap position delivers every insert
        again (``flowwarden_checkpoints reset --seen-token``); no run, step or approval
        is added. The caller checks that its workers ran nothing more."""
        seen = json.dumps(self.bootstrap["last_seen_token"])
        self.manage("flowwarden_checkpoints", "reset", "orders", "--seen-token", seen, "--yes")
        assert self.burst() == ORDERS, "the reset stream reads every insert again"
        time.sleep(1.0)  # a step queued by the redelivery would be done by now
        assert self.runs_by_status() == {"completed": ORDERS}
        keys = self.db.query(
            "SELECT idempotency_key, count(*) FROM flowwarden_django_workflowrun "
            "WHERE workflow_name = %s GROUP BY idempotency_key",
            [WORKFLOW],
        )
        assert dict(keys) == {key(i): 1 for i in range(1, ORDERS + 1)}
        assert self.approvals() == [(self.approval_id, self.large_cid, "approved")]
        assert len(self.chain(self.large_cid)) == 3
        assert self.order_approval(LARGE_ORDER) == "approved"

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
