"""A Celery worker notices a silent partition from its Redis broker within the bound,
and works again once it heals (issue 51, item 2).

A real ``celery worker`` (prefork) runs inside the test's namespace, its broker and
result backend the lane's Redis through a forwarder; it answers an echo task sent from
the host. The link is cut while the worker waits on BRPOP: the settings the package
gives every worker (``integrations/celery/network.py``: kombu's health check every sixth
of ``DEAD_CONNECTION_TIMEOUT``, socket timeouts, keepalives) make it drop the silent
connection; Celery's own defaults would wait ``brpop_timeout + 2 * 25`` s (51 s) for an
idle BRPOP, and the kernel's retransmission timeout for a command in flight.

* Until noticed: the link heals once the worker logs that it gave up on the
  connection (``DEAD_CONNECTION_TIMEOUT`` 6 s and 30 s).
* 5 s and 60 s partitions (the default 30 s bound), a task sent from the host 2 s
  into each: it is answered after healing, nothing lost. (A task pushed in the first
  second is taken by the worker's BRPOP still pending on the server, whose answer
  goes into the cut link: after a partition long enough for the worker to drop that
  connection, the task is lost. kombu's Redis transport has no acknowledgement for
  that step; the package's tasks come back by ``STREAM_EVENT_TIMEOUT`` or the
  workflow recovery sweep.)

Each then answers a task after healing and exits on SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from tests.faults.celery_echo import ECHO_TASK
from tests.faults.figures import report
from tests.faults.netns import NetworkNamespace
from tests.support.celery_procs import CeleryWorker
from tests.support.celery_workflow_settings import transport_options
from tests.support.polling import wait_until
from tests.support.services import SERVICES
from tests.support.story_procs import ROOT, die_with_parent

pytestmark = [pytest.mark.faults, pytest.mark.subprocess, pytest.mark.lane("redis")]

#: Room beyond the bound for a loaded machine (the figure is printed).
SLACK = 30.0
#: Seconds into a partition before the task sent during it: kombu's BRPOP waits 1 s
#: on the server, which pops a task pushed meanwhile and answers into the void.
BRPOP_GRACE = 2.0
#: What the worker logs when it gives up on a silent broker connection.
NOTICED = re.compile(
    r"dropping stale connection|Connection to broker lost|Cannot connect to redis"
    r"|Timeout reading from|Error while reading from|Timeout connecting"
)


class NamespacedWorker(CeleryWorker):
    """A :class:`CeleryWorker` whose command *wrap* runs inside a namespace."""

    def __init__(
        self,
        env: dict[str, str],
        pool: list[str],
        log_path: Path,
        wrap: Callable[[list[str]], list[str]],
    ) -> None:
        self.log_path = log_path
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.support.celery_app",
            "worker",
            *pool,
            "--loglevel=INFO",
            f"--hostname=fw-fault-{uuid.uuid4().hex[:8]}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                wrap(command),
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )


def echo(app: Celery, value: str, timeout: float) -> dict:
    return app.send_task(ECHO_TASK, args=[value]).get(timeout=timeout)


@contextlib.contextmanager
def namespaced_worker(
    namespace: NetworkNamespace, log_path: Path, bound: float
) -> Iterator[tuple[NamespacedWorker, Celery]]:
    """A worker inside *namespace* (``DEAD_CONNECTION_TIMEOUT`` *bound*) that has
    answered a first echo, and a producer on the host; both gone afterwards, with the
    queue's keys."""
    server = SERVICES["redis"]
    forwarder = namespace.forward(server.port, server.host)
    queue = f"fw-fault-{uuid.uuid4().hex[:12]}"
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.faults.celery_broker_settings",
        "FLOWWARDEN_CELERY_BROKER_URL": f"redis://{forwarder.host}:{forwarder.port}/14",
        "FLOWWARDEN_CELERY_QUEUE": queue,
        "FW_FAULT_FLOWWARDEN": json.dumps({"DEAD_CONNECTION_TIMEOUT": f"{bound}s"}),
    }
    host_url = f"redis://{server.host}:{server.port}/14"
    producer = Celery("fw-fault-producer", broker=host_url, backend=host_url, fixups=[])
    producer.conf.task_default_queue = queue
    producer.conf.broker_transport_options = transport_options(queue)
    worker = NamespacedWorker(
        env, ["--pool=prefork", "--concurrency=1"], log_path, namespace.command
    )
    try:
        worker.wait_ready()
        assert echo(producer, "before", 60)["value"] == "before"
        yield worker, producer
    except BaseException:
        print(worker.log_tail(), file=sys.stderr)
        raise
    finally:
        worker.kill()
        producer.close()
        client = redis.Redis(host=server.host, port=server.port, db=14)
        options = transport_options(queue)
        client.delete(
            queue,
            f"_kombu.binding.{queue}",
            options["unacked_key"],
            options["unacked_index_key"],
            options["unacked_mutex_key"],
        )
        client.close()


def stop(worker: NamespacedWorker) -> tuple[int, float]:
    """SIGTERM: the exit code and the seconds it took."""
    stopping = time.monotonic()
    code = worker.terminate()
    return code, time.monotonic() - stopping


@pytest.mark.parametrize(
    "bound", [pytest.param(6, id="6s"), pytest.param(30, id="30s", marks=pytest.mark.slow)]
)
def test_a_worker_notices_a_silent_broker_partition_within_the_bound(
    namespace: NetworkNamespace, tmp_path, bound
):
    with namespaced_worker(namespace, tmp_path / "w.log", bound) as (worker, producer):
        seen = len(worker.log())
        cut_at = namespace.cut()
        noticed = wait_until(
            lambda: NOTICED.search(worker.log()[seen:]),
            "the worker to notice the partition",
            timeout=bound + SLACK,
        )
        noticed_after = time.monotonic() - cut_at
        healed_at = namespace.heal()
        assert echo(producer, "after", 90)["value"] == "after"
        answered_after = time.monotonic() - healed_at
        code, stopped_after = stop(worker)
    report(
        f"[faults] Celery worker, Redis broker, DEAD_CONNECTION_TIMEOUT {bound} s: a silent "
        f"partition noticed {noticed_after:.1f} s after the cut ({noticed.group(0)!r}); "
        f"answered a task {answered_after:.1f} s after healing; SIGTERM exit "
        f"{stopped_after:.1f} s (code {code})"
    )
    assert noticed_after <= bound + SLACK
    assert code == 0


@pytest.mark.parametrize(
    "partition", [pytest.param(5, id="5s"), pytest.param(60, id="60s", marks=pytest.mark.slow)]
)
def test_a_task_sent_during_a_broker_partition_is_handled_after_healing(
    namespace: NetworkNamespace, tmp_path, partition
):
    bound = 30
    with namespaced_worker(namespace, tmp_path / "w.log", bound) as (worker, producer):
        seen = len(worker.log())
        cut_at = namespace.cut()
        # Past the worker's BRPOP pending on the server (brpop_timeout, 1 s): a task
        # pushed before that is popped into the dead connection (see the docstring).
        time.sleep(BRPOP_GRACE)
        during = producer.send_task(ECHO_TASK, args=["during"])
        time.sleep(max(0.0, cut_at + partition - time.monotonic()))  # the partition itself
        noticed = NOTICED.search(worker.log()[seen:])
        healed_at = namespace.heal()
        assert during.get(timeout=90)["value"] == "during"
        handled_after = time.monotonic() - healed_at
        assert echo(producer, "after", 90)["value"] == "after"
        code, stopped_after = stop(worker)
    report(
        f"[faults] Celery worker, Redis broker, {partition} s partition "
        f"(DEAD_CONNECTION_TIMEOUT {bound} s): "
        + (f"noticed ({noticed.group(0)!r}); " if noticed else "not noticed (shorter); ")
        + f"the task sent during it answered {handled_after:.1f} s after healing; "
        f"SIGTERM exit {stopped_after:.1f} s (code {code})"
    )
    if partition > bound + SLACK / 2:
        assert noticed, "a partition longer than the bound went unnoticed"
    assert code == 0
