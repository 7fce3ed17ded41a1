"""A Celery worker cut off from PostgreSQL in the middle of a step (issue 51).

The cut-off worker (``celery worker --pool=threads``, ``WORKFLOW_EXECUTION =
"celery"``: steps as tasks, and the recovery sweep in every worker) runs in a
namespace of the test's own and reaches both the PostgreSQL test database and its
Redis broker through forwarders on the host end of the one link: cutting the link
cuts it off from both, as a worker whose own network fails is. A second
worker of the same settings runs on the host. Both use the libpq parameters ``check
--deploy`` asks for (W501), and the Redis transport options ``docs/network_faults.md``
asks for (``socket_timeout`` and keepalives, ``common.network.redis_options``):
without them the cut-off worker's main loop blocks in kombu's restore of unacknowledged
messages (a ``SET`` on the silent connection) and it does not stop on SIGTERM until
TCP retransmits, over 10 s after a 60 s partition heals.

While the cut-off worker's ``slow`` step runs (``fw-celery-partitioned``), the link is
cut. Its claim runs out (nobody renews it); the host's worker's sweep finds the run
stalled and queues the step again, and the host's worker runs it and the rest of the
run. The step's first message stays unacknowledged with the cut-off worker (the
broker's visibility timeout is Redis' hour). Once the run has completed and the
partition has lasted its length, the link heals and the test releases the cut-off
worker's step: its late save is refused, by the fence (the task is dropped: "no
longer holds", or "another runner" for the snapshot's ``seq``) when its database
connection survived, or on the connection its keepalives declared dead
(``OperationalError``). Nothing is written twice: one snapshot per ``seq``; ``slow``
ran twice, every other step once; ``slow`` is transactional, and its ``Effect`` row is
committed once (the cut-off worker's rolled back with its save). The cut-off worker
then exits on SIGTERM within 10 s.

The "postgres-alone" variants cut the worker off from PostgreSQL only: the database
goes through a link of its own (``tests.faults.links``), the broker through the
namespace's link, which stays up. The cut-off worker would still take tasks, among
them the step queued again, and block on the database; instead, once its claim has gone
unrenewed for half the lease, it stops consuming (``integrations.celery.silence``), and
a step it had already reserved is handed back to the queue, so the host's worker takes
the step again. Once its late save is refused (its claim dropped), it takes tasks
again, then gets the SIGTERM. Everything else is as above.

The 5 s partitions run under a 2 s claim lease and ``WORKFLOW_RECOVER_AFTER``, so that
it outlasts them; the 60 s one under the defaults (10 s each).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("celery", reason="the Celery tests need celery")
pytest.importorskip("redis", reason="the Celery workflow tests need redis-py")

from celery import Celery
from django.db import connections
from django.test import override_settings

from flowwarden_django.common.network import postgres_options
from flowwarden_django.integrations.celery.provider import CeleryExecutionProvider
from flowwarden_django.models import WorkflowRun
from flowwarden_django.workflows import RunStatus, workflow_registry
from flowwarden_django.workflows.execution.providers import reset_providers
from tests.faults.figures import report
from tests.faults.takeover import partition_during_takeover
from tests.faults.worker_logs import first_notice
from tests.support import celery_workflows as flows
from tests.support.celery_procs import CeleryWorker
from tests.support.celery_workflow_settings import transport_options
from tests.support.lanes import lane_marks
from tests.support.polling import wait_until
from tests.support.services import SERVICES
from tests.support.step_log import assert_chained, assert_committed_once, executions
from tests.support.story_procs import ROOT

DB = "postgres"
#: The run completes on the host within this many seconds of the cut (the issue's bound).
COMPLETION_BOUND = 20.0
#: The cut-off worker exits within this many seconds of SIGTERM after the healing.
EXIT_BOUND = 10.0
POOL = ["--pool=threads", "--concurrency=2"]
#: What the cut-off worker logs when it notices the partition.
NOTICES = (
    "renewing run claims failed",
    "recovery sweep",
    "Connection to broker lost",
    "OperationalError",
    "database silent",
)
#: What the cut-off worker logs when it stops taking tasks (``celery.silence``).
PAUSED = "stops taking tasks"
#: What it logs when it takes them again.
RESUMED = "database answers again"

pytestmark = [
    *lane_marks("postgres", databases=["default", DB]),
    pytest.mark.lane("redis"),
    pytest.mark.faults,
    pytest.mark.subprocess,
]


@pytest.fixture
def broker_url() -> str:
    server = SERVICES["redis"]
    return f"redis://{server.host}:{server.port}/14"


@pytest.fixture
def queue(broker_url: str) -> Iterator[str]:
    """A queue of this test alone, deleted afterwards with the transport's keys."""
    name = f"fw-partition-{uuid.uuid4().hex[:12]}"
    yield name
    import redis
    from kombu import Connection, Exchange, Queue

    with Connection(broker_url) as connection:
        bound = Queue(name, Exchange(name), routing_key=name)(connection.default_channel)
        bound.declare()
        bound.delete()
    options = transport_options(name)
    server = SERVICES["redis"]
    client = redis.Redis(host=server.host, port=server.port, db=14)
    client.delete(
        options["unacked_key"], options["unacked_index_key"], options["unacked_mutex_key"]
    )
    client.close()


@pytest.fixture
def producer(broker_url: str, queue: str) -> Iterator[Celery]:
    """The app this process publishes steps with; not made the current app."""
    app = Celery("fw-partition-producer", broker=broker_url, fixups=[], set_as_current=False)
    app.conf.task_default_queue = queue
    app.conf.broker_transport_options = transport_options(queue)
    yield app
    app.close()


@pytest.fixture
def definition() -> Iterator[Any]:
    defined = flows.define_workflows(DB)
    yield defined[flows.PARTITIONED]
    for name in defined:
        workflow_registry.unregister(name)


def _worker_env(
    database: dict[str, Any], host: str, port: int, broker_url: str, queue: str, extra: dict
) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.support.celery_workflow_settings",
        "FLOWWARDEN_CELERY_DB_NAME": database["NAME"],
        "FLOWWARDEN_CELERY_DB_HOST": host,
        "FLOWWARDEN_CELERY_DB_PORT": str(port),
        "FLOWWARDEN_CELERY_DB_USER": str(database["USER"]),
        "FLOWWARDEN_CELERY_DB_PASSWORD": str(database["PASSWORD"]),
        "FLOWWARDEN_CELERY_DB_OPTIONS": json.dumps(postgres_options()),
        "FLOWWARDEN_CELERY_BROKER_URL": broker_url,
        "FLOWWARDEN_CELERY_QUEUE": queue,
        "FLOWWARDEN_CELERY_WORKFLOW_EXECUTION": "celery",
        "FLOWWARDEN_CELERY_BROKER_BOUNDS": "1",
        **extra,
    }
    for name in ("FLOWWARDEN_CELERY_VISIBILITY_TIMEOUT", "FLOWWARDEN_CELERY_RUN_STREAMS"):
        env.pop(name, None)
    return env


def _state_of(cid: str) -> tuple[str, bool]:
    """Run *cid*'s runner, and whether it has completed."""
    run = WorkflowRun.objects.using(DB).get(pk=cid)
    return run.runner, run.status == RunStatus.COMPLETED


def _when(condition: Any, what: str, timeout: float) -> float:
    """Poll *condition* until it holds; the ``time.monotonic()`` when it did."""
    wait_until(condition, what, timeout=max(timeout, 0.0), interval=0.05)
    return time.monotonic()


def _late_save(worker: CeleryWorker, cid: str) -> str | None:
    """How the cut-off worker's late save ended, once its log says so."""
    for line in worker.log().splitlines():
        dropped = "step task dropped" in line and cid in line
        if dropped and ("no longer holds" in line or "another runner" in line):
            return "fenced"
        if "raised unexpected" in line:
            kind = "OperationalError" if "OperationalError" in line else line[-160:]
            return f"refused on a dead connection ({kind})"
    return None


def _stop(worker: CeleryWorker, timeout: float) -> int | None:
    """SIGTERM (a warm shutdown) and its exit code within *timeout*; ``None`` (then
    SIGKILLed) when it did not exit."""
    worker.proc.send_signal(signal.SIGTERM)
    try:
        return worker.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        worker.proc.send_signal(signal.SIGUSR1)  # Celery logs every thread's stack
        time.sleep(1.0)  # for the failure message: where it hangs
        worker.kill()
        return None


@pytest.mark.parametrize("severed", ["with-broker", "postgres-alone"])
@pytest.mark.parametrize(
    ("partition", "settings"),
    [
        pytest.param(
            5.0,
            {
                "FLOWWARDEN_CELERY_RUN_LEASE": "2s",
                "FLOWWARDEN_CELERY_FLOWWARDEN": '{"WORKFLOW_RECOVER_AFTER": "2s"}',
            },
            id="5s",
        ),
        pytest.param(60.0, {}, id="60s", marks=pytest.mark.slow),
    ],
)
def test_a_celery_worker_cut_off_mid_step_is_replaced_and_its_late_save_refused(
    namespace,
    definition,
    producer,
    broker_url,
    queue,
    tmp_path: Path,
    partition,
    settings,
    severed,
):
    state = {
        "log": str(tmp_path / "steps.log"),
        "release": str(tmp_path / "release"),
        "sleep": 0.5,
        "trail": [],
    }
    database = connections[DB].settings_dict
    pg, redis_server = SERVICES["postgres"], SERVICES["redis"]
    # "postgres-alone": PostgreSQL through a link of its own, cut alone; the broker
    # (the namespace's link) stays reachable.
    link = namespace.add_link() if severed == "postgres-alone" else namespace
    pg_forwarder = link.forward(pg.port, pg.host)
    broker_forwarder = namespace.forward(redis_server.port, redis_server.host)
    inside_broker = f"redis://{broker_forwarder.host}:{broker_forwarder.port}/14"
    inside_env = _worker_env(
        database, pg_forwarder.host, pg_forwarder.port, inside_broker, queue, settings
    )
    host_env = _worker_env(database, pg.host, pg.port, broker_url, queue, settings)
    inside = CeleryWorker(inside_env, POOL, tmp_path / "inside.log", wrap=namespace.command)
    host: CeleryWorker | None = None
    try:
        inside.wait_ready()
        with override_settings(
            FLOWWARDEN={"WORKFLOW_EXECUTION": CeleryExecutionProvider(app=producer)}
        ):
            cid = (
                definition.workflow(f"partitioned-{uuid.uuid4().hex[:8]}")
                .run(state)
                .coordination_id
            )
        wait_until(
            lambda: any(e["step"] == "slow" for e in executions(state["log"])),
            "the slow step's start on the cut-off worker",
            timeout=60,
        )
        host = CeleryWorker(host_env, POOL, tmp_path / "host.log")
        host.wait_ready()
        cut_wall = time.time()
        took = partition_during_takeover(
            link,
            lambda: _state_of(cid),
            partition=partition,
            bound=COMPLETION_BOUND,
        )
        open(state["release"], "w").close()  # the cut-off worker's step ends now
        released_at = time.monotonic()
        refused_at = _when(lambda: _late_save(inside, cid) is not None, "the late save", 60)
        outcome = _late_save(inside, cid)
        resumed = ""
        if severed == "postgres-alone":
            # Its step ended, its claim dropped: it takes tasks again.
            resumed_at = _when(lambda: RESUMED in inside.log(), "taking tasks again", 30)
            resumed = f", it took tasks again {resumed_at - refused_at:.1f} s after that"
            refused_at = resumed_at
        code = _stop(inside, EXIT_BOUND)
        exited_at = time.monotonic()
    except BaseException:
        tails = [inside.log_tail(80), host.log_tail(80) if host else ""]
        print(
            "\n--- cut-off worker ---\n{}\n--- host's worker ---\n{}".format(*tails),
            file=sys.stderr,
        )
        raise
    finally:
        reset_providers()
        inside.kill()
        if host is not None:
            host.kill()
        # Its connections end: a transaction the cut-off worker left open rolls back.
        pg_forwarder.stop()
    lease = settings.get("FLOWWARDEN_CELERY_RUN_LEASE", "10s")
    cut = took.cut_at
    what = "PostgreSQL alone" if severed == "postgres-alone" else "PostgreSQL and its broker"
    report(
        f"[faults] Celery worker cut off from {what} for "
        f"{took.healed_at - cut:.0f} s mid-step (lease {lease}): it noticed "
        f"{first_notice(inside.log(), cut_wall, NOTICES)} after the cut, stopped taking "
        f"tasks {first_notice(inside.log(), cut_wall, (PAUSED,))} after it; the host's worker "
        f"took the run over {took.taken_over_at - cut:.1f} s after the cut and completed it "
        f"{took.done_at - cut:.1f} s after it; the step released once the run had completed "
        f"and the link healed, its late save was {outcome} {refused_at - released_at:.1f} s "
        f"after{resumed}; SIGTERM exit {exited_at - refused_at:.1f} s after that"
    )
    if partition < 30:  # shorter than the keepalives' bound: the connection survives
        assert outcome == "fenced", inside.log_tail(80)
    assert code is not None, f"the cut-off worker did not exit on SIGTERM:\n{inside.log_tail(200)}"
    counts = Counter(e["step"] for e in executions(state["log"]))
    assert counts == {"one": 1, "slow": 2, "three": 1, "four": 1}
    assert_chained(definition.workflow(cid), ["one", "slow", "three", "four"])
    # The transactional slow step's effect: the host's worker's execution's row, once.
    assert_committed_once(cid, "slow", state["log"], DB, execution=2)
