"""Transactional streams cut off from PostgreSQL, then from MongoDB (issue 51).

The consumer (``tests.faults.partitioned_stream``: a threaded, an asyncio or a
parallel stream under a ``StreamManager``) runs in a namespace of the test's own. It
reaches the PostgreSQL test database (its checkpoints, its handler's rows and its
status rows) through a forwarder on the namespace's first link, and the development
MongoDB (the testkit's scripted replica set, as ``manage.py flowwarden_mongo_dev``
serves it, in a process on the host) through a forwarder on a second link
(``add_link()``), so that the test cuts it off from one server at a time. The test
inserts one order every ``1 / RATE`` s while it runs, through its own client.

Each test cuts one link while events flow, for 5 s (``DEAD_CONNECTION_TIMEOUT`` 3 s,
so that the outage is noticed within it) or 60 s (the default 30 s), then heals it.
It prints the time from the cut to the consumer reporting the outage
(``restarting``) and from the healing to the first event handled, and checks:

* every order inserted has exactly one ``Effect`` row (0 lost, 0 duplicates: each
  row commits with its event's anchor or settled mark);
* the consumer reported the outage while it lasted: in its own status (the state
  its manager reports, all the time) and, cut off from MongoDB only, in its
  ``StreamWorker`` row (what ``flowwarden_streams status`` and ``/health`` read);
* it handled an event again within :data:`RESUME_BOUND` s of the healing;
* it exits on SIGTERM within :data:`EXIT_BOUND` s at the end.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pymongo", reason="the stream partition tests need pymongo")
pytest.importorskip("mockupdb", reason="the development MongoDB needs mockupdb")

from django.db import connections

from flowwarden_django.common.network import postgres_options
from flowwarden_django.models import StreamWorker
from tests.faults.figures import report
from tests.faults.processes import JsonLinesProcess, database_env
from tests.support.lanes import lane_marks
from tests.support.polling import wait_until
from tests.support.services import SERVICES
from tests.support.story_procs import ROOT, die_with_parent
from tests.testapp.models import Effect

DB = "postgres"
#: Orders inserted per second while a test runs.
RATE = 20.0
#: The consumer handles an event again within this many seconds of the healing.
RESUME_BOUND = 10.0
#: It exits within this many seconds of SIGTERM at the end.
EXIT_BOUND = 10.0
#: Room beyond a bound for a loaded machine, where a wait decides nothing (the figure
#: is printed; the bound is what the docs promise).
SLACK = 30.0
#: While the outage lasts, the consumer reports one of these.
OUTAGE_STATES = ("restarting",)

pytestmark = [
    *lane_marks("postgres", databases=["default", DB]),
    pytest.mark.faults,
    pytest.mark.subprocess,
]


class DevMongo:
    """The development MongoDB in a process on the host, and the test's client of it,
    inserting ``{_id: n, seq: n}`` at :data:`RATE` per second while :meth:`feeding`."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flowwarden_django.testkit.scripted_mongo", "--port", "0"],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            preexec_fn=die_with_parent,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("READY "):
            raise RuntimeError(f"the development MongoDB did not start: {line!r}")
        self.port = int(line.split("localhost:")[1].split("/")[0])
        from pymongo import MongoClient

        self.client: Any = MongoClient(
            f"mongodb://127.0.0.1:{self.port}/?directConnection=true",
            serverSelectionTimeoutMS=10_000,
        )
        self.inserted: list[int] = []
        self._stop = threading.Event()
        self._feeder: threading.Thread | None = None

    def feed(self) -> None:
        """Insert at :data:`RATE` per second until :meth:`stop_feeding`."""
        orders = self.client["app"]["orders"]

        def insert() -> None:
            seq = 0
            while not self._stop.wait(1 / RATE):
                seq += 1
                orders.insert_one({"_id": seq, "seq": seq})
                self.inserted.append(seq)

        self._feeder = threading.Thread(target=insert, daemon=True)
        self._feeder.start()

    def stop_feeding(self) -> None:
        self._stop.set()
        if self._feeder is not None:
            self._feeder.join(30)

    def close(self) -> None:
        self.stop_feeding()
        self.client.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def mongo() -> Iterator[DevMongo]:
    server = DevMongo()
    yield server
    server.close()


def _handled(consumer: JsonLinesProcess, after: float = 0.0) -> list[dict[str, Any]]:
    return [e for e in consumer.events() if e["event"] == "handled" and e["t"] > after]


def _states(consumer: JsonLinesProcess, after: float = 0.0) -> list[dict[str, Any]]:
    return [e for e in consumer.events() if e["event"] == "state" and e["t"] > after]


def _published_state(name: str) -> str:
    row = StreamWorker.objects.using(DB).filter(stream_name=name).first()
    return row.state if row is not None else ""


@pytest.mark.parametrize(
    ("partition", "bound"),
    [pytest.param(5.0, 3, id="5s"), pytest.param(60.0, 30, id="60s", marks=pytest.mark.slow)],
)
@pytest.mark.parametrize("server", ["postgres", "mongodb"])
@pytest.mark.parametrize("runner", ["threads", "asyncio", "parallel"])
def test_a_transactional_stream_cut_off_loses_nothing_and_resumes(
    namespace, mongo, tmp_path, runner, server, partition, bound
):
    name = f"fault-{runner}-{uuid.uuid4().hex[:6]}"
    pg = SERVICES["postgres"]
    to_mongo = namespace.add_link()
    pg_forwarder = namespace.forward(pg.port, pg.host)
    mongo_forwarder = to_mongo.forward(mongo.port)
    link = namespace if server == "postgres" else to_mongo
    env = {
        **database_env(connections[DB].settings_dict, pg_forwarder.host, pg_forwarder.port),
        "FW_WF_DB_OPTIONS": json.dumps(postgres_options(bound)),
        "FW_FAULT_MONGO_URL": (
            f"mongodb://{mongo_forwarder.host}:{mongo_forwarder.port}/?directConnection=true"
        ),
        "FW_FAULT_FLOWWARDEN": json.dumps({"DEAD_CONNECTION_TIMEOUT": f"{bound}s"}),
    }
    consumer = JsonLinesProcess(
        ["tests.faults.partitioned_stream", runner, name],
        env,
        tmp_path / "consumer",
        wrap=namespace.command,
    )
    published = ""
    try:
        wait_until(
            lambda: any(e["state"] == "running" for e in _states(consumer)),
            "the stream running",
            timeout=60,
            interval=0.1,
        )
        mongo.feed()
        wait_until(lambda: len(_handled(consumer)) >= 20, "events handled", 60, 0.1)
        cut_wall = time.time()
        cut_at = link.cut()
        detected = wait_until(
            lambda: next(
                (e for e in _states(consumer, cut_wall) if e["state"] in OUTAGE_STATES), None
            ),
            "the outage reported",
            timeout=bound + SLACK,
            interval=0.1,
        )
        if server == "mongodb":  # PostgreSQL still reachable: the status rows say it too
            published = wait_until(
                lambda: _published_state(name) in OUTAGE_STATES and _published_state(name),
                "the outage in the stream's status row",
                timeout=SLACK,
                interval=0.1,
            )
        time.sleep(max(0.0, cut_at + partition - time.monotonic()))  # the partition itself
        last_state = _states(consumer)[-1]
        healed_wall = time.time()
        healed_at = link.heal()
        first = wait_until(
            lambda: next(iter(_handled(consumer, healed_wall)), None),
            "an event handled after healing",
            timeout=RESUME_BOUND + SLACK,
            interval=0.1,
        )
        mongo.stop_feeding()
        inserted = list(mongo.inserted)
        wait_until(
            lambda: set(inserted) <= {e["seq"] for e in _handled(consumer)},
            "every order handled",
            timeout=120,
            interval=0.2,
        )
        stopping = time.monotonic()
        code = consumer.stop(signal.SIGTERM, timeout=EXIT_BOUND + SLACK)
        exited_after = time.monotonic() - stopping
    except BaseException:
        print(consumer.describe(), file=sys.stderr)
        raise
    finally:
        consumer.stop(signal.SIGKILL)
    print("\n".join(line for line in consumer.printed if '"handled"' not in line)[-6000:])
    rows = Counter(Effect.objects.using(DB).filter(stream=name).values_list("order_id", flat=True))
    lost = sorted(set(inserted) - set(rows))
    duplicates = {seq: n for seq, n in rows.items() if n > 1}
    resumed_after = first["t"] - healed_wall
    report(
        f"[faults] {runner} stream (transactional) cut off from {server} for "
        f"{healed_at - cut_at:.1f} s, DEAD_CONNECTION_TIMEOUT {bound} s: outage reported "
        f"{detected['t'] - cut_wall:.1f} s after the cut ({detected['error']}"
        f"{', and in its status row' if published else ''}); first event "
        f"{resumed_after:.1f} s after healing; {len(inserted)} orders, {len(lost)} lost, "
        f"{len(duplicates)} duplicates; SIGTERM exit {exited_after:.1f} s"
    )
    assert not lost, lost[:20]
    assert not duplicates, duplicates
    assert last_state["state"] in OUTAGE_STATES, last_state  # still reported at the healing
    if server == "mongodb":
        assert published in OUTAGE_STATES, published
    assert resumed_after <= RESUME_BOUND, resumed_after
    assert code == 0, f"the consumer did not exit on SIGTERM (code {code})"
    assert exited_after <= EXIT_BOUND
