"""SINGLE_LEADER with real processes: the leader is SIGKILLed, the standby takes over.

Two consumer processes (``manage.py flowwarden_streams run`` with
``FLOWWARDEN_CRASH_MODE=leader``, see ``tests/crash/``) run the ``crash-orders``
stream against one scripted MongoDB server. The stream is transactional and the
ORM lease lives in the same PostgreSQL database, so each event's ``Effect`` row
(labelled with the instance that handled it), its processed anchor and the lease
check commit together. The test feeds the events, SIGKILLs the leader while they
flow, and checks from the data:

* the standby took the lease over within TTL + one standby poll of the kill
  (printed);
* every event has exactly one row, and no event has rows from two owners (printed,
  must be 0): the killed leader's in-flight transaction rolled back and the new
  leader resumed right after the last committed anchor;
* the new leader's fencing token is greater than the old one's.

It runs with both processes on threads (``flowwarden_streams run --threads``), and
mixed (``--asyncio`` for the leader: the asyncio runner keeps the lease from its event
loop and runs each transactional attempt on the stream's own thread): an asyncio
leader killed, a threaded standby taking over, both holding the same lease records.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("mockupdb", reason="the scripted MongoDB server needs mockupdb==1.8.1")

from django.db import connections
from django.db.models import Count, Max

from flowwarden_django.models import StreamLease, StreamWorker
from tests.streams.test_crash import (
    ROOT,
    START_TIMEOUT,
    STREAM,
    Consumer,
    _read_line,
    _stop,
)
from tests.support.lanes import on_lane
from tests.support.story_procs import die_with_parent
from tests.testapp.models import Effect

EVENTS = 3000
TTL, RENEW, POLL = 3.0, 0.5, 0.5
#: Scheduling slack on top of TTL + poll before the takeover counts as late.
SLACK = 3.0
LEADER, STANDBY = "host-a:leader", "host-b:standby"
#: (the leader's runner, the standby's runner), by test id.
RUNNER_PAIRS = {
    "threads": ("threads", "threads"),
    "asyncio-leader-threads-standby": ("asyncio", "threads"),
}


def _wait(condition, timeout, what, *consumers):
    deadline = time.monotonic() + timeout
    while not condition():
        for consumer in consumers:
            consumer.assert_alive()
        if time.monotonic() > deadline:
            logs = "\n".join(c.log_tail() for c in consumers)
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}:\n{logs}")
        time.sleep(0.01)


def _lease() -> StreamLease | None:
    return StreamLease.objects.using("postgres").filter(name=STREAM).first()


def _rows() -> int:
    return Effect.objects.using("postgres").count()


@pytest.mark.slow
@on_lane("postgres", databases=["default", "postgres"])
@pytest.mark.parametrize("runners", list(RUNNER_PAIRS))
def test_standby_takes_over_after_the_leader_is_killed(runners, tmp_path, capsys, record_property):
    leader_runner, standby_runner = RUNNER_PAIRS[runners]
    record_property("leader_runner", leader_runner)
    record_property("standby_runner", standby_runner)
    db = connections["postgres"].settings_dict
    server = leader = standby = None
    try:
        server = subprocess.Popen(
            [sys.executable, "-m", "tests.crash.server", "--events", str(EVENTS)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=(tmp_path / "server.log").open("w"),
            text=True,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        ready = _read_line(server, START_TIMEOUT, "READY line")
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "tests.crash.settings",
            "FLOWWARDEN_CRASH_MONGO_URL": ready.split()[1],
            "FLOWWARDEN_CRASH_DB_NAME": db["NAME"],
            "FLOWWARDEN_CRASH_DB_HOST": str(db["HOST"]),
            "FLOWWARDEN_CRASH_DB_PORT": str(db["PORT"]),
            "FLOWWARDEN_CRASH_DB_USER": db["USER"],
            "FLOWWARDEN_CRASH_DB_PASSWORD": db["PASSWORD"] or "",
            "FLOWWARDEN_CRASH_MODE": "leader",
            "FLOWWARDEN_CRASH_LEASE_TTL": f"{TTL}s",
            "FLOWWARDEN_CRASH_RENEW_INTERVAL": f"{RENEW}s",
            "FLOWWARDEN_CRASH_POLL_INTERVAL": f"{POLL}s",
        }
        leader = Consumer(
            {**env, "FLOWWARDEN_CRASH_INSTANCE": LEADER},
            tmp_path / "leader.log",
            runner=leader_runner,
        )
        standby = Consumer(
            {**env, "FLOWWARDEN_CRASH_INSTANCE": STANDBY},
            tmp_path / "standby.log",
            runner=standby_runner,
        )

        leader.start()
        _wait(
            lambda: (lease := _lease()) is not None and lease.owner.startswith(LEADER + "#"),
            START_TIMEOUT,
            "the first consumer to lead",
            leader,
        )
        standby.start()
        _wait(
            lambda: (
                StreamWorker.objects.using("postgres")
                .filter(stream_name=STREAM, instance_id=STANDBY, state="standby")
                .exists()
            ),
            START_TIMEOUT,
            "the second consumer to stand by",
            leader,
            standby,
        )
        first_token = _lease().token
        server.send_signal(__import__("signal").SIGUSR1)  # feed the events
        fed = _read_line(server, START_TIMEOUT, "FED line")
        assert fed.startswith("FED "), fed
        _wait(lambda: _rows() >= EVENTS // 5, 120, "the leader to handle events", leader, standby)

        leader.kill()
        killed_at = time.monotonic()
        rows_at_kill = _rows()
        _wait(
            lambda: _lease().owner.startswith(STANDBY + "#"),
            TTL + POLL + 30,
            "the standby to lead",
            standby,
        )
        takeover = time.monotonic() - killed_at
        _wait(
            lambda: (
                (Effect.objects.using("postgres").aggregate(m=Max("order_id"))["m"] or 0) >= EVENTS
            ),
            180,
            "the new leader to catch up",
            standby,
        )
        assert standby.terminate() == 0, standby.log_tail()
        new_token = _lease().token
    finally:
        for process in (leader, standby):
            if process is not None:
                process.close()
        _stop(server)

    per_order = (
        Effect.objects.using("postgres")
        .values("order_id")
        .annotate(rows=Count("id"), owners=Count("stream", distinct=True))
    )
    duplicates = sum(row["rows"] - 1 for row in per_order)
    two_owners = sum(1 for row in per_order if row["owners"] > 1)
    by_owner = dict(Effect.objects.using("postgres").values_list("stream").annotate(n=Count("id")))
    with capsys.disabled():
        print(
            f"\nSINGLE_LEADER kill test [leader {leader_runner}, standby {standby_runner}]: "
            f"takeover {takeover:.2f} s after SIGKILL "
            f"(TTL {TTL:.0f} s, poll {POLL} s); events handled by two owners: {two_owners}; "
            f"duplicate rows: {duplicates}; rows by owner: {by_owner}; "
            f"rows when killed: {rows_at_kill}; fencing tokens {first_token} -> {new_token}"
        )
    record_property("takeover_seconds", round(takeover, 3))
    record_property("events_handled_by_two_owners", two_owners)
    assert len(per_order) == EVENTS
    assert two_owners == 0 and duplicates == 0
    assert set(by_owner) == {LEADER, STANDBY}
    assert new_token > first_token
    assert takeover <= TTL + POLL + SLACK, f"takeover took {takeover:.2f} s"
