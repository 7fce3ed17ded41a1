"""The development MongoDB (ScriptedReplicaSet) under hostile load and over time: big
``$in`` queries, a slow query beside other clients, internal errors, and a cluster
clock that keeps up with the wall clock."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("mockupdb", reason="the scripted MongoDB fake needs mockupdb==1.8.1")

import pymongo
from bson import Timestamp
from pymongo.errors import OperationFailure

from flowwarden_django.testkit import _scripted_match
from flowwarden_django.testkit._scripted_events import EventLog, parse_token
from flowwarden_django.testkit._scripted_match import compile_filter
from flowwarden_django.testkit.scripted_mongo import MAX_INTERNAL_ERRORS, ScriptedReplicaSet

DB, COLL = "app", "orders"
DEADLINE = 30.0


@pytest.fixture(scope="module")
def _server() -> Iterator[ScriptedReplicaSet]:
    with ScriptedReplicaSet() as server:
        yield server


@pytest.fixture
def srv(_server: ScriptedReplicaSet) -> ScriptedReplicaSet:
    _server.reset()
    return _server


@pytest.fixture
def client(srv: ScriptedReplicaSet) -> Iterator[pymongo.MongoClient]:
    mongo: pymongo.MongoClient = pymongo.MongoClient(srv.uri, serverSelectionTimeoutMS=10_000)
    try:
        yield mongo
    finally:
        mongo.close()


def _count(client: pymongo.MongoClient, query: dict[str, Any]) -> int:
    return int(client[DB].command("count", COLL, query=query)["n"])


# --------------------------------------------------------------------------------------- #
# $in: one lookup per value, not one comparison per option
# --------------------------------------------------------------------------------------- #
def test_in_with_thousands_of_values_looks_values_up(monkeypatch):
    """A 2,000-value $in over 20,000 documents used to compare each document with
    each option (40 million comparisons, ~20 s); scalars are now looked up in a set."""
    calls = 0
    real_equal = _scripted_match.bson_equal

    def counted(left: Any, right: Any) -> bool:
        nonlocal calls
        calls += 1
        if calls > 100_000:
            raise AssertionError("$in compares every document with every option")
        return real_equal(left, right)

    monkeypatch.setattr(_scripted_match, "bson_equal", counted)
    wanted = list(range(0, 4000, 2))
    matches = compile_filter({"seq": {"$in": wanted}})
    docs = [{"_id": n, "seq": n} for n in range(20_000)]
    assert sum(1 for doc in docs if matches(doc)) == 2000
    assert calls == 0


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"v": {"$in": [1, "a"]}}, {"int", "float", "int64", "str", "array"}),
        ({"v": {"$in": [None]}}, {"null", "missing"}),
        ({"v": {"$in": [True]}}, {"bool"}),
        ({"v": {"$in": [{"k": 1}]}}, {"doc"}),
        ({"v": {"$in": [[1, "z"]]}}, {"array"}),
        ({"v": {"$nin": [1, None]}}, {"str", "bool", "doc"}),
    ],
)
def test_in_matches_as_before_for_every_kind_of_value(query, expected):
    from bson import Int64

    docs = [
        {"_id": "int", "v": 1},
        {"_id": "float", "v": 1.0},
        {"_id": "int64", "v": Int64(1)},
        {"_id": "str", "v": "a"},
        {"_id": "bool", "v": True},
        {"_id": "null", "v": None},
        {"_id": "missing"},
        {"_id": "doc", "v": {"k": 1}},
        {"_id": "array", "v": [1, "z"]},
    ]
    matches = compile_filter(query)
    assert {doc["_id"] for doc in docs if matches(doc)} == expected


def test_a_count_with_a_2000_value_in_over_20000_documents_answers(srv, client):
    srv.seed(DB, COLL, ({"_id": n, "seq": n} for n in range(20_000)))
    assert _count(client, {"seq": {"$in": list(range(0, 4000, 2))}}) == 2000
    assert client[DB][COLL].count_documents({"seq": {"$in": [5, 7, 70_000]}}) == 2
    assert srv.internal_errors == []


# --------------------------------------------------------------------------------------- #
# A slow query holds up no other client
# --------------------------------------------------------------------------------------- #
def test_a_slow_query_does_not_hold_up_other_clients(srv, client, monkeypatch):
    """The count is held inside its matcher (on an event, not a clock) while a second
    client connects and pings: the ping is answered before the count is let go."""
    srv.seed(DB, COLL, ({"_id": n, "meta": {"k": n % 3}} for n in range(30)))
    in_query, release = threading.Event(), threading.Event()
    real_equal = _scripted_match.bson_equal

    def held(left: Any, right: Any) -> bool:
        if not in_query.is_set():
            in_query.set()
            release.wait(DEADLINE)
        return real_equal(left, right)

    monkeypatch.setattr(_scripted_match, "bson_equal", held)
    counted: list[Any] = []
    counter = threading.Thread(
        target=lambda: counted.append(_count(client, {"meta": {"$in": [{"k": 1}]}}))
    )
    counter.start()
    try:
        assert in_query.wait(DEADLINE), "the count reached its matcher"
        pinged: list[Any] = []
        other = pymongo.MongoClient(srv.uri, serverSelectionTimeoutMS=int(DEADLINE * 1000))

        def ping() -> None:
            try:
                pinged.append(other.admin.command("ping")["ok"])
            except Exception as exc:  # the assertion below reports it
                pinged.append(exc)

        pinger = threading.Thread(target=ping)
        pinger.start()
        pinger.join(DEADLINE)
        held_still = not release.is_set() and counter.is_alive()
        other.close()
        assert pinged == [1.0], f"the second client was not served: {pinged}"
        assert held_still, "the ping was answered while the count ran"
    finally:
        release.set()
        counter.join(DEADLINE)
    assert counted == [10]


# --------------------------------------------------------------------------------------- #
# Internal errors: a short message to the client, the traceback logged once, kept bounded
# --------------------------------------------------------------------------------------- #
def test_an_internal_error_answers_a_short_message_and_logs_the_traceback_once(
    srv, client, monkeypatch, caplog
):
    def broken(self: ScriptedReplicaSet, doc: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("boom")

    monkeypatch.setitem(ScriptedReplicaSet._handlers, "ping", broken)
    caplog.set_level(logging.ERROR, logger="flowwarden_django.testkit.scripted_mongo")
    with pytest.raises(OperationFailure) as info:
        client.admin.command("ping")
    message = info.value.details["errmsg"]
    assert info.value.code == 1 and info.value.details["codeName"] == "InternalError"
    assert "'ping'" in message and "KeyError" in message
    assert "Traceback" not in message and ".py" not in message and "/" not in message
    assert len(message) < 200
    [record] = [r for r in caplog.records if r.name.endswith("scripted_mongo")]
    assert record.exc_info is not None, "the server's log has the traceback"
    [kept] = srv.internal_errors
    assert "Traceback" in kept and "KeyError" in kept

    for _ in range(MAX_INTERNAL_ERRORS + 20):
        with pytest.raises(OperationFailure):
            client.admin.command("ping")
    assert len(srv.internal_errors) == MAX_INTERNAL_ERRORS, "the kept tracebacks are bounded"
    monkeypatch.undo()
    srv.reset()
    assert srv.internal_errors == []


# --------------------------------------------------------------------------------------- #
# The cluster clock keeps up with the wall clock
# --------------------------------------------------------------------------------------- #
class _FakeWallClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_event_log_positions_follow_the_wall_clock_and_never_go_back():
    wall = _FakeWallClock(1_000.5)
    log = EventLog(1_000, wall_clock=wall)
    assert log.oldest == (1_000, 1)
    first = log.insert(DB, COLL, {"_id": 1}).pos
    wall.now = 1_065.2
    second = log.insert(DB, COLL, {"_id": 2}).pos
    assert second == (1_065, 1), "an event takes the wall clock's second"
    third = log.insert(DB, COLL, {"_id": 3}).pos
    assert third == (1_065, 2), "strictly increasing within the second"
    wall.now = 900.0  # the wall clock steps back
    fourth = log.insert(DB, COLL, {"_id": 4}).pos
    assert fourth == (1_065, 3)
    assert [first, second, third, fourth] == sorted({first, second, third, fourth})
    log.advance(100)  # ahead of the wall clock: kept until the wall clock passes it
    assert log.tick() == (1_165, 1)
    wall.now = 1_200.0
    assert log.tick() == (1_200, 1)


def test_event_log_gives_a_batch_of_inserts_consecutive_positions():
    """insert_many is one write: its events sit at consecutive positions of one second
    even when the wall clock moves on meanwhile (crash tests map positions to orders)."""

    class Racing(_FakeWallClock):
        def __call__(self) -> float:
            self.now += 0.4
            return self.now

    log = EventLog(7_000, wall_clock=Racing(7_000.0))
    positions = log.insert_many(DB, COLL, ({"_id": n} for n in range(10)))
    seconds = positions[0][0]
    assert positions == [(seconds, positions[0][1] + n) for n in range(10)]
    assert log.insert(DB, COLL, {"_id": 10}).pos[0] > seconds, "then the clock moves on"


def test_event_log_issues_the_periodic_no_op_when_the_wall_clock_runs_ahead():
    wall = _FakeWallClock(5_000.0)
    log = EventLog(5_000, wall_clock=wall, noop_interval=10)
    assert log.last_position == (5_000, 1)
    wall.now = 5_009.9
    assert log.last_position == (5_000, 1), "within the no-op interval nothing is written"
    wall.now = 5_420.0
    assert log.last_position == (5_420, 1), "an idle oplog's time keeps up"
    assert log.last_position == (5_420, 1)
    assert EventLog(5_000).last_position == (5_000, 1), "no wall clock: a pinned clock"


def test_cluster_time_and_idle_resume_tokens_advance_with_the_wall_clock(srv, client):
    """A stream that is current must not look minutes behind: its idle postBatchResumeToken
    and the server's operationTime move on with the wall clock (polled to a deadline)."""
    event = srv.insert(DB, COLL, {"_id": 1})
    started = event["clusterTime"]
    version = srv.data_version
    before = time.time()
    with client[DB][COLL].watch(max_await_time_ms=10) as stream:
        deadline = time.monotonic() + DEADLINE
        token_time = started.time
        while token_time <= started.time and time.monotonic() < deadline:
            assert stream.try_next() is None
            token_time = parse_token(stream.resume_token)[0][0]
    after = time.time()
    assert token_time > started.time, "the idle resume token kept the start time"
    # Whole seconds read between before and after (a second of slack for the truncation).
    assert int(before) - 1 <= token_time <= after, "the idle resume token is about now"
    assert srv.cluster_time > started
    assert srv.data_version == version, "the clock moving is no write (flowwarden_mongo_dev)"
    later = srv.insert(DB, COLL, {"_id": 2})["clusterTime"]
    assert srv.data_version != version
    assert later > srv.events()[0]["clusterTime"] and later.time >= token_time
    reply = client[DB].command("count", COLL)
    assert isinstance(reply["operationTime"], Timestamp)
    assert reply["operationTime"] >= later
