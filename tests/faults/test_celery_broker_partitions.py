"""A Celery worker notices a silent partition from its Redis broker within the bound,
and works again once it heals (issue 51, item 2).

A real ``celery worker`` (prefork) runs inside the test's namespace, its broker and
result backend the lane's Redis through a forwarder; it answers an echo task sent from
the host. The link is cut while the worker waits on BRPOP: the settings the package
gives every worker (``integrations/celery/network.py``: kombu's health check every third
of ``DEAD_CONNECTION_TIMEOUT``, socket timeouts, keepalives) make it drop the silent
connection; Celery's own defaults would wait ``brpop_timeout + 2 * 25`` s (51 s). The
link heals, the worker answers the next echo, and it exits on SIGTERM.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
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


@pytest.mark.parametrize(
    "bound", [pytest.param(6, id="6s"), pytest.param(30, id="30s", marks=pytest.mark.slow)]
)
def test_a_worker_notices_a_silent_broker_partition_within_the_bound(
    namespace: NetworkNamespace, tmp_path, bound
):
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
        env, ["--pool=prefork", "--concurrency=1"], tmp_path / "w.log", namespace.command
    )
    try:
        worker.wait_ready()
        assert echo(producer, "before", 60)["value"] == "before"
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
        stopping = time.monotonic()
        code = worker.terminate()
        stopped_after = time.monotonic() - stopping
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
    report(
        f"[faults] Celery worker, Redis broker, DEAD_CONNECTION_TIMEOUT {bound} s: a silent "
        f"partition noticed {noticed_after:.1f} s after the cut ({noticed.group(0)!r}); "
        f"answered a task {answered_after:.1f} s after healing; SIGTERM exit "
        f"{stopped_after:.1f} s (code {code})"
    )
    assert noticed_after <= bound + SLACK
