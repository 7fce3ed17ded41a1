"""A single-leader stream whose leader is cut off from its lock service (issue 51).

Two instances of ``fw-leader-orders`` (``tests.faults.leader_stream``) run
``flowwarden_streams run``: the leader, *A*, inside a namespace of the test's own, the
standby, *B*, on the host. Both keep their lease on the test Redis (``RedisLockService``),
their checkpoints and status rows in the PostgreSQL test database, and read the scripted
MongoDB replica set. *A* reaches Redis through a forwarder on the namespace's link, and
PostgreSQL and MongoDB through loopback bridges the link does not carry
(``tests.faults.loopback_bridge``): cutting the link cuts *A* off from Redis only.

While *A* handles events, the link is cut for 5 s or 60 s. *A* must stop handling
events before its lease can pass (its lease is judged on its own clock, from each
renewal's sending); *B* takes the lease over once it expired and handles the rest.
Once healed, *A* stands by again (its status says ``standby``) and, when *B* is
SIGTERMed, leads again and handles the last batch.

Checked from the handlers' records (``time.monotonic()`` is one clock for every
process of the host): no event of one instance was handled while another instance was
in a handler (never two leaders), every event was handled (0 lost; the stream is not
transactional and writes no anchor within a batch, so the events of the batch the
leader was handling are handled again by the next leader), *A*'s status reported the
lock service's outage while it lasted, and each process exits within 10 s of SIGTERM.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from typing import Any

import pytest
from django.db import connections

from flowwarden_django.models import StreamWorker
from tests.faults.conftest import require
from tests.faults.figures import report
from tests.faults.leader_stream import BATCH, STREAM
from tests.faults.loopback_bridge import bridge_loopback
from tests.faults.processes import JsonLinesProcess, database_env
from tests.support.lanes import lane_marks
from tests.support.polling import wait_until
from tests.support.services import SERVICES, redis_db, unavailable_reason

pytest.importorskip("mockupdb", reason="the scripted MongoDB server needs mockupdb==1.8.1")

DB = "postgres"
#: Each process exits within this many seconds of SIGTERM at the end.
EXIT_BOUND = 10.0
TTL, RENEW, POLL = 3.0, 0.5, 0.5
SETTINGS = {
    "LEADER_LEASE_TTL": f"{TTL}s",
    "LEADER_RENEW_INTERVAL": f"{RENEW}s",
    "STANDBY_POLL_INTERVAL": f"{POLL}s",
    # Redis's socket timeout is 90 % of it: a renewal sent into the partition fails
    # within 2.7 s, and the lease (3 s) is not trusted past 2.7 s after its last renewal.
    "DEAD_CONNECTION_TIMEOUT": "3s",
}
A, B = "lease-a:inside", "lease-b:host"
#: What a status row says while its process's lock service does not answer.
UNREACHABLE = "the lock service does not answer"

pytestmark = [
    *lane_marks("postgres", databases=["default", DB]),
    pytest.mark.faults,
    pytest.mark.subprocess,
]


def _clear_lease() -> None:
    import redis

    client = redis.Redis.from_url(_redis_url(SERVICES["redis"].host, SERVICES["redis"].port))
    with client:
        client.delete(f"fw:lease:{STREAM}", f"fw:fence:{STREAM}")


def _redis_url(host: str, port: int) -> str:
    return f"redis://{host}:{port}/{redis_db()}"


def _worker(instance: str) -> StreamWorker | None:
    return StreamWorker.objects.using(DB).filter(stream_name=STREAM, instance_id=instance).first()


def _logs(process: JsonLinesProcess, after: float, *words: str) -> list[dict[str, Any]]:
    """The log lines *process* printed at ``m >= after`` that contain every word."""
    return [
        e
        for e in process.events()
        if e["event"] == "log" and e["m"] >= after and all(w in e["message"] for w in words)
    ]


def _handled(*processes: JsonLinesProcess) -> list[dict[str, Any]]:
    return sorted(
        (e for p in processes for e in p.events() if e["event"] == "handled"),
        key=lambda e: e["m0"],
    )


def _first(events: list[dict[str, Any]], key: str = "m") -> float | None:
    return events[0][key] if events else None


def _since(moment: float | None, origin: float) -> str:
    return "never" if moment is None else f"{moment - origin:.1f} s"


def overlaps(records: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Pairs of handler runs of two instances that overlap in time (must be none)."""
    found = []
    latest: dict[str, dict[str, Any]] = {}  # instance -> its run that ended last
    for record in sorted(records, key=lambda e: e["m0"]):
        for instance, other in latest.items():
            if instance != record["instance"] and other["m1"] > record["m0"]:
                found.append((other, record))
        mine = latest.get(record["instance"])
        if mine is None or record["m1"] > mine["m1"]:
            latest[record["instance"]] = record
    return found


def test_overlaps_finds_two_leaders_at_once():
    def run(instance: str, m0: float, m1: float) -> dict[str, Any]:
        return {"instance": instance, "m0": m0, "m1": m1}

    assert overlaps([run("a", 0, 1), run("a", 1, 2), run("b", 3, 4), run("a", 5, 6)]) == []
    clash = [run("a", 0, 1), run("b", 0.5, 0.7), run("a", 2, 3)]
    assert overlaps(clash) == [(clash[0], clash[1])]


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
@pytest.mark.parametrize(
    "partition", [pytest.param(5.0, id="5s"), pytest.param(60.0, id="60s", marks=pytest.mark.slow)]
)
def test_a_leader_cut_off_from_redis_stops_then_stands_by_again(
    namespace, tmp_path, partition, runner
):
    require(unavailable_reason("redis"))
    _clear_lease()
    pg, redis_server = SERVICES["postgres"], SERVICES["redis"]
    db = connections[DB].settings_dict
    server = JsonLinesProcess(["tests.faults.leader_stream", "serve"], {}, tmp_path / "mongo")
    a = b = None
    try:
        uri = server.wait_for_line("READY").split()[1]
        mongo_port = int(uri.split("://")[1].split("/")[0].split(",")[0].rsplit(":", 1)[1])
        forwarder = namespace.forward(redis_server.port, redis_server.host)
        common = {"FW_LS_MONGO_URL": uri, "FW_LS_FLOWWARDEN": json.dumps(SETTINGS)}
        with (
            bridge_loopback(namespace, mongo_port, tmp_path),
            bridge_loopback(namespace, pg.port, tmp_path),
        ):
            a = JsonLinesProcess(
                ["tests.faults.leader_stream", "consume", A, runner],
                {
                    **common,
                    **database_env(db, pg.host, pg.port),
                    "FW_LS_REDIS_URL": _redis_url(forwarder.host, forwarder.port),
                },
                tmp_path / "a",
                wrap=namespace.command,
            )
            wait_until(lambda: _logs(a, 0, "leads"), "A to lead", timeout=60)
            b = JsonLinesProcess(
                ["tests.faults.leader_stream", "consume", B, runner],
                {
                    **common,
                    **database_env(db, pg.host, pg.port),
                    "FW_LS_REDIS_URL": _redis_url(redis_server.host, redis_server.port),
                },
                tmp_path / "b",
            )
            wait_until(
                lambda: (w := _worker(B)) is not None and w.state == "standby",
                "B to stand by",
                timeout=60,
            )
            server.proc.send_signal(signal.SIGUSR1)  # batch 1
            wait_until(
                lambda: sum(1 for e in _handled(a) if e["seq"] <= BATCH) >= 20,
                "A to handle events",
                timeout=60,
            )
            cut_at = namespace.cut()
            wait_until(lambda: _handled(b), "B to handle events", timeout=60)
            server.proc.send_signal(signal.SIGUSR1)  # batch 2, while A is cut off
            outage = wait_until(
                lambda: (w := _worker(A)) is not None and UNREACHABLE in w.last_error and w,
                "A's status to report the lock service's outage",
                timeout=max(5.0, partition - 1),
            )
            time.sleep(max(0.0, cut_at + partition - time.monotonic()))  # the partition
            healed_at = namespace.heal()
            wait_until(
                lambda: (
                    (w := _worker(A)) is not None
                    and w.state == "standby"
                    and UNREACHABLE not in w.last_error
                ),
                "A to stand by again",
                timeout=60,
            )
            standby_at = time.monotonic()
            b_stopped_at = time.monotonic()  # B releases its lease as it stops
            code_b = b.stop(signal.SIGTERM, timeout=EXIT_BOUND)
            exits = [time.monotonic() - b_stopped_at]
            wait_until(lambda: _logs(a, b_stopped_at, "leads"), "A to lead again", timeout=60)
            server.proc.send_signal(signal.SIGUSR1)  # batch 3, for A
            wait_until(
                lambda: {e["seq"] for e in _handled(a, b)} >= set(range(1, 3 * BATCH + 1)),
                "every event handled",
                timeout=120,
            )
            a_stopping_at = time.monotonic()
            code_a = a.stop(signal.SIGTERM, timeout=EXIT_BOUND)
            exits.append(time.monotonic() - a_stopping_at)
    except BaseException:
        for name, process in (("A", a), ("B", b), ("mongo", server)):
            if process is not None:
                lines = [line for line in process.printed if '"handled"' not in line]
                print(f"{name}:\n" + "\n".join(lines[-60:]), file=sys.stderr)
                print(process.describe().split("stderr:")[-1], file=sys.stderr)
        raise
    finally:
        for process in (a, b):
            if process is not None:
                process.stop(signal.SIGKILL, timeout=10)
        server.stop()
    records = _handled(a, b)
    a_after_cut = [e for e in records if e["instance"] == A and cut_at <= e["m0"] < healed_at]
    a_stopped = max((e["m1"] for e in a_after_cut), default=cut_at)
    lost_lease = _first(_logs(a, cut_at, "lost the lease") or _logs(a, cut_at, "stopping"))
    b_leads = _first(_logs(b, cut_at, "leads"))
    b_first = _first([e for e in records if e["instance"] == B], "m0")
    a_leads_again = _first(_logs(a, b_stopped_at, "leads"))
    clashes = overlaps(records)
    report(
        f"[faults] single-leader stream ({runner}), leader cut off from Redis for "
        f"{healed_at - cut_at:.0f} s (lease {TTL:.0f} s, renew {RENEW} s): the leader's last "
        f"event ended {a_stopped - cut_at:.1f} s after the cut and it logged the lost lease "
        f"{_since(lost_lease, cut_at)} after it; the standby led {_since(b_leads, cut_at)} "
        f"after the cut (first event {_since(b_first, cut_at)}); after healing the cut-off "
        f"instance stood by again {standby_at - healed_at:.1f} s later and led "
        f"{_since(a_leads_again, b_stopped_at)} after the other's SIGTERM; "
        f"{len(records)} handler runs for {3 * BATCH} events, {len(clashes)} overlapping; "
        f"SIGTERM exits "
        f"{exits[0]:.1f} s and {exits[1]:.1f} s"
    )
    assert clashes == []
    assert {e["seq"] for e in records} == set(range(1, 3 * BATCH + 1))
    assert code_b is not None and code_a is not None, "a process did not exit on SIGTERM"
    assert b_first is not None and b_first > a_stopped
    assert (outage.state, outage.role) == ("standby", "STANDBY")
