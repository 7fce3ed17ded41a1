"""The real pymongo driver against ScriptedReplicaSet, the wire-level change-stream fake.

These tests pin two things at once: what the fake answers (tokens, PBRTs, errors and
labels shaped like a 6.0+ server's) and how pymongo's own ``ChangeStream`` reacts
(auto-resume, retryable reads, resume_token tracking). They prove nothing about a real
server; the live lane does that.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mockupdb", reason="the scripted MongoDB fake needs mockupdb==1.8.1")

import pymongo
from bson import Int64, ObjectId, Timestamp
from pymongo import CursorType
from pymongo.errors import OperationFailure
from pymongo.read_concern import ReadConcern

from flowwarden_django.testkit.scripted_mongo import ScriptedReplicaSet

ROOT = Path(__file__).resolve().parents[2]
DB, COLL = "app", "orders"


@pytest.fixture(scope="module")
def _server() -> Iterator[ScriptedReplicaSet]:
    # One server per module: mockupdb's stop() takes about a second.
    with ScriptedReplicaSet() as server:
        yield server


@pytest.fixture
def srv(_server: ScriptedReplicaSet) -> Iterator[ScriptedReplicaSet]:
    _server.reset()
    yield _server
    assert not _server.internal_errors, _server.internal_errors[0]


@pytest.fixture
def client(srv: ScriptedReplicaSet) -> Iterator[pymongo.MongoClient]:
    mongo: pymongo.MongoClient = pymongo.MongoClient(srv.uri, serverSelectionTimeoutMS=5000)
    try:
        yield mongo
    finally:
        mongo.close()


@pytest.fixture
def coll(client: pymongo.MongoClient) -> Any:
    return client[DB][COLL]


def drain(stream: Any, limit: int = 100_000) -> list[dict[str, Any]]:
    """Every event available now (stops at the first idle poll)."""
    events = []
    while len(events) < limit:
        event = stream.try_next()
        if event is None:
            break
        events.append(event)
    return events


def stages(srv: ScriptedReplicaSet) -> list[dict[str, Any]]:
    return [doc["pipeline"][0]["$changeStream"] for doc in srv.commands("aggregate")]


# --------------------------------------------------------------------------------------- #
# Handshake and plain commands
# --------------------------------------------------------------------------------------- #
def test_handshake_ping_build_info_and_unknown_command(srv, client):
    assert client.admin.command("ping")["ok"] == 1
    assert client.server_info()["version"].startswith("7.")
    with pytest.raises(OperationFailure) as info:
        client.admin.command("frobnicate")
    assert info.value.code == 59
    assert info.value.details["codeName"] == "CommandNotFound"
    hello = srv.commands("hello") + srv.commands("ismaster")
    assert hello, "the driver's handshake is recorded"
    [ping] = srv.commands("ping")
    assert (ping["ping"], ping["$db"]) == (1, "admin")
    assert srv.recorded[-1].name == "frobnicate"
    assert client.topology_description.topology_type_name == "ReplicaSetWithPrimary"


def test_uri_names_the_replica_set(srv):
    assert srv.uri == f"mongodb://localhost:{srv.port}/?replicaSet=rs0"


# --------------------------------------------------------------------------------------- #
# Reading events
# --------------------------------------------------------------------------------------- #
def test_reads_events_in_order_with_real_fields(srv, coll):
    with coll.watch() as stream:
        srv.insert(DB, COLL, {"_id": 1, "status": "new", "tags": ["a"]})
        srv.update(
            DB, COLL, 1, set_fields={"status": "paid", "meta.by": "bob"}, unset_fields=["tags"]
        )
        srv.replace(DB, COLL, {"_id": 1, "status": "shipped"})
        srv.delete(DB, COLL, 1)
        events = [stream.try_next() for _ in range(4)]
        assert stream.resume_token == events[-1]["_id"]
        assert stream.try_next() is None

    assert [e["operationType"] for e in events] == ["insert", "update", "replace", "delete"]
    insert, update, replace, delete = events
    for event in events:
        assert set(event["_id"]) == {"_data"}
        assert event["_id"]["_data"].startswith("82")
        assert isinstance(event["clusterTime"], Timestamp)
        # pymongo decodes datetimes naive (UTC) unless the client is tz_aware.
        wall = datetime.fromtimestamp(event["clusterTime"].time, UTC).replace(tzinfo=None)
        assert event["wallTime"] == wall
        assert event["ns"] == {"db": DB, "coll": COLL}
        assert event["documentKey"] == {"_id": 1}
        assert "txnNumber" not in event and "lsid" not in event
    positions = [(e["clusterTime"].time, e["clusterTime"].inc) for e in events]
    assert positions == sorted(positions) and len(set(positions)) == 4
    tokens = [e["_id"]["_data"] for e in events]
    assert tokens == sorted(tokens), "tokens order lexically like positions"
    assert insert["fullDocument"] == {"_id": 1, "status": "new", "tags": ["a"]}
    assert "fullDocument" not in update, "no post-image unless the stream asks for one"
    assert update["updateDescription"] == {
        "updatedFields": {"status": "paid", "meta.by": "bob"},
        "removedFields": ["tags"],
        "truncatedArrays": [],
    }
    assert replace["fullDocument"] == {"_id": 1, "status": "shipped"}
    assert "fullDocument" not in delete and "fullDocumentBeforeChange" not in delete


def test_clock_start_and_advance():
    fake = ScriptedReplicaSet(start_time=datetime(2024, 1, 1, tzinfo=UTC), follow_wall_clock=False)
    start = int(datetime(2024, 1, 1, tzinfo=UTC).timestamp())
    assert fake.oldest_retained == Timestamp(start, 1)
    first = fake.insert(DB, COLL, {"_id": 1})
    assert first["clusterTime"] == Timestamp(start, 2)
    assert first["wallTime"] == datetime(2024, 1, 1, tzinfo=UTC)
    assert fake.advance_clock(90) == Timestamp(start + 90, 0)
    assert fake.insert(DB, COLL, {"_id": 2})["clusterTime"] == Timestamp(start + 90, 1)
    fake.set_clock(datetime(2024, 1, 2, tzinfo=UTC))
    assert fake.insert(DB, COLL, {"_id": 3})["clusterTime"].time == start + 86_400
    with pytest.raises(ValueError):
        fake.set_clock(start)


def test_no_op_update_logs_nothing(srv):
    srv.insert(DB, COLL, {"_id": 1, "x": 1})
    assert srv.update(DB, COLL, 1, set_fields={"x": 1}) is None
    assert [e["operationType"] for e in srv.events(DB, COLL)] == ["insert"]
    with pytest.raises(ValueError):
        srv.update(DB, COLL, "missing", set_fields={"x": 1})
    with pytest.raises(ValueError):
        srv.insert(DB, COLL, {"_id": 1})


def test_watch_starts_now_and_batch_size_limits_batches(srv, coll):
    srv.insert_many(DB, COLL, [{"_id": n} for n in range(3)])
    with coll.watch(batch_size=2) as stream:
        assert stream.try_next() is None, "a stream without a start option starts at 'now'"
        srv.insert_many(DB, COLL, [{"_id": n} for n in range(3, 8)])
        assert [e["fullDocument"]["_id"] for e in drain(stream)] == [3, 4, 5, 6, 7]
    assert srv.commands("aggregate")[0]["cursor"] == {"batchSize": 2}
    assert all(doc["batchSize"] == 2 for doc in srv.commands("getMore"))


def test_first_batch_and_reply_shape(srv, client):
    tokens = srv.insert_many(DB, COLL, [{"_id": n} for n in range(5)])
    reply = client[DB].command(
        "aggregate",
        COLL,
        pipeline=[{"$changeStream": {"startAfter": tokens[0]}}],
        cursor={"batchSize": 2},
    )
    cursor = reply["cursor"]
    assert [e["documentKey"]["_id"] for e in cursor["firstBatch"]] == [1, 2]
    assert cursor["postBatchResumeToken"] == tokens[2], "a full batch ends at its last event"
    assert cursor["id"] != 0 and cursor["ns"] == f"{DB}.{COLL}"
    assert isinstance(reply["operationTime"], Timestamp)
    more = client[DB].command("getMore", cursor["id"], collection=COLL, batchSize=10)
    assert [e["documentKey"]["_id"] for e in more["cursor"]["nextBatch"]] == [3, 4]
    assert more["cursor"]["postBatchResumeToken"] == tokens[4]
    assert cursor["id"] in srv.open_cursors


def test_max_await_time_ms_becomes_get_more_max_time_ms(srv, coll):
    with coll.watch(max_await_time_ms=15) as stream:
        assert stream.try_next() is None
    assert srv.commands("getMore")[0]["maxTimeMS"] == 15
    assert "maxTimeMS" not in srv.commands("aggregate")[0]
    assert "maxAwaitTimeMS" not in srv.commands("aggregate")[0]


def test_idle_polls_return_none_and_advance_the_resume_token(srv, coll):
    srv.insert(DB, COLL, {"_id": 1})
    with coll.watch(max_await_time_ms=10) as stream:
        seen = [stream.resume_token["_data"]]
        for _ in range(4):
            assert stream.try_next() is None
            seen.append(stream.resume_token["_data"])
        assert stream.alive
    assert seen == sorted(seen) and len(set(seen)) == len(seen), "each idle PBRT is newer"
    assert srv.cluster_time > srv.events()[-1]["clusterTime"]


def test_idle_get_more_wakes_up_for_a_new_event(srv, coll):
    """The insert lands while the getMore waits; the server counts the wait a write
    ended (its time, 30 s, never runs out here)."""
    srv.idle_wait = 30.0

    def insert_once_it_waits() -> None:
        while not srv.idle_waiters:
            time.sleep(0.005)
        srv.insert(DB, COLL, {"_id": "late"})

    try:
        woken = srv.idle_wakeups
        with coll.watch(max_await_time_ms=30_000) as stream:
            writer = threading.Thread(target=insert_once_it_waits)
            writer.start()
            event = stream.try_next()
            writer.join()
        assert event is not None and event["documentKey"] == {"_id": "late"}
        assert srv.idle_wakeups == woken + 1
    finally:
        srv.idle_wait = 0.02


# --------------------------------------------------------------------------------------- #
# Start and resume options
# --------------------------------------------------------------------------------------- #
def test_resume_after_a_mid_log_token_returns_exactly_the_following_events(srv, coll):
    tokens = srv.insert_many(DB, COLL, [{"_id": n} for n in range(10)])
    with coll.watch(resume_after=tokens[3]) as stream:
        assert [e["fullDocument"]["_id"] for e in drain(stream)] == [4, 5, 6, 7, 8, 9]
    assert stages(srv)[0] == {"resumeAfter": tokens[3]}


def test_resume_after_an_idle_no_op_token(srv, coll):
    srv.insert(DB, COLL, {"_id": 0})
    with coll.watch(max_await_time_ms=10) as stream:
        assert stream.try_next() is None
        heartbeat = stream.resume_token
    assert heartbeat != srv.events()[-1]["_id"], "the idle PBRT is a no-op, not an event"
    srv.insert_many(DB, COLL, [{"_id": 1}, {"_id": 2}])
    with coll.watch(resume_after=heartbeat) as stream:
        assert [e["fullDocument"]["_id"] for e in drain(stream)] == [1, 2]


def test_start_at_operation_time_includes_its_own_time(srv, coll):
    srv.insert_many(DB, COLL, [{"_id": n} for n in range(3)])
    srv.advance_clock(5)
    later = [srv.insert(DB, COLL, {"_id": n}) for n in range(3, 6)]
    with coll.watch(start_at_operation_time=later[0]["clusterTime"]) as stream:
        assert [e["fullDocument"]["_id"] for e in drain(stream)] == [3, 4, 5]
    assert later[0]["clusterTime"].time == srv.events()[0]["clusterTime"].time + 5


def test_start_after_an_invalidate_token_opens_a_new_stream(srv, coll):
    srv.insert(DB, COLL, {"_id": 1})
    drop, invalidate = srv.drop_collection(DB, COLL)
    assert (drop["operationType"], invalidate["operationType"]) == ("drop", "invalidate")
    srv.insert(DB, COLL, {"_id": "recreated"})
    with coll.watch(start_after=invalidate["_id"]) as stream:
        assert [e["fullDocument"]["_id"] for e in drain(stream)] == ["recreated"]
    with pytest.raises(OperationFailure) as info:
        coll.watch(resume_after=invalidate["_id"])
    assert info.value.code == 260
    assert "not allowed from an invalidate notification" in str(info.value)
    assert not info.value.details.get("errorLabels")


def test_only_one_start_option_is_accepted(srv, client):
    token = srv.insert(DB, COLL, {"_id": 1})["_id"]
    with pytest.raises(OperationFailure) as info:
        client[DB].command(
            "aggregate",
            COLL,
            pipeline=[{"$changeStream": {"resumeAfter": token, "startAfter": token}}],
            cursor={},
        )
    assert info.value.code == 40674


def test_database_and_cluster_streams(srv, client):
    db_stream = client[DB].watch()
    cluster_stream = client.watch()
    try:
        srv.insert(DB, "a", {"_id": 1})
        srv.insert("other", "b", {"_id": 2})
        srv.drop_collection(DB, "a")
        assert [(e["operationType"], e["ns"]) for e in drain(db_stream)] == [
            ("insert", {"db": DB, "coll": "a"}),
            ("drop", {"db": DB, "coll": "a"}),
        ]
        assert db_stream.alive, "dropping a collection does not invalidate a database stream"
        assert [e["operationType"] for e in drain(cluster_stream)] == ["insert", "insert", "drop"]
    finally:
        db_stream.close()
        cluster_stream.close()
    assert stages(srv)[1] == {"allChangesForCluster": True}


# --------------------------------------------------------------------------------------- #
# Pipelines and document options
# --------------------------------------------------------------------------------------- #
def test_match_filters_and_the_pbrt_moves_past_filtered_events(srv, coll):
    srv.insert(DB, COLL, {"_id": "seed"})
    with coll.watch([{"$match": {"operationType": "insert"}}]) as stream:
        srv.insert(DB, COLL, {"_id": 1, "n": 1})
        srv.update(DB, COLL, 1, set_fields={"n": 2})
        last_update = srv.update(DB, COLL, 1, set_fields={"n": 3})
        event = stream.try_next()
        assert event["operationType"] == "insert"
        # The batch's PBRT is the last event examined (a filtered update), ahead of _id.
        assert stream.resume_token == last_update["_id"]
        assert stream.resume_token["_data"] > event["_id"]["_data"]

        only_filtered = srv.update(DB, COLL, 1, set_fields={"n": 4})
        assert stream.try_next() is None
        assert stream.resume_token["_data"] > only_filtered["_id"]["_data"]


def test_match_operators_on_dotted_paths(srv, coll):
    pipeline = [
        {
            "$match": {
                "$or": [
                    {
                        "fullDocument.kind": {"$in": ["a", "b"]},
                        "fullDocument.flag": {"$exists": True},
                    },
                    {"$and": [{"operationType": "delete"}, {"documentKey._id": {"$nin": [99]}}]},
                ]
            }
        }
    ]
    with coll.watch(pipeline) as stream:
        srv.insert(DB, COLL, {"_id": 1, "kind": "a", "flag": None})
        srv.insert(DB, COLL, {"_id": 2, "kind": "b"})
        srv.insert(DB, COLL, {"_id": 3, "kind": "c", "flag": 1})
        srv.insert(DB, COLL, {"_id": 99, "kind": "z"})
        srv.delete(DB, COLL, 3)
        srv.delete(DB, COLL, 99)
        got = [(e["operationType"], e["documentKey"]["_id"]) for e in drain(stream)]
    assert got == [("insert", 1), ("delete", 3)]


@pytest.mark.parametrize(
    "pipeline,code",
    [
        ([{"$project": {"fullDocument": 1}}], 40324),
        ([{"$match": {"fullDocument.n": {"$regex": "^a"}}}], 2),
    ],
)
def test_unsupported_stages_and_operators_are_refused(srv, coll, pipeline, code):
    with pytest.raises(OperationFailure) as info:
        coll.watch(pipeline)
    assert info.value.code == code


def test_update_lookup_and_pre_images(srv, coll):
    srv.insert(DB, COLL, {"_id": 1, "n": 1})
    with (
        coll.watch(full_document="updateLookup") as lookup,
        coll.watch(
            full_document="whenAvailable", full_document_before_change="whenAvailable"
        ) as images,
    ):
        srv.update(DB, COLL, 1, set_fields={"n": 2})
        update = lookup.try_next()
        assert update["fullDocument"] == {"_id": 1, "n": 2}
        srv.update(DB, COLL, 1, set_fields={"n": 3})
        srv.delete(DB, COLL, 1)
        # updateLookup reads the document as it is now: gone.
        assert lookup.try_next()["fullDocument"] is None
        first, second, delete = drain(images)
    assert first["fullDocument"] == {"_id": 1, "n": 2}, "whenAvailable: the post-image"
    assert first["fullDocumentBeforeChange"] == {"_id": 1, "n": 1}
    assert second["fullDocument"] == {"_id": 1, "n": 3}
    assert delete["fullDocumentBeforeChange"] == {"_id": 1, "n": 3}
    assert stages(srv)[1]["fullDocumentBeforeChange"] == "whenAvailable"


# --------------------------------------------------------------------------------------- #
# History loss
# --------------------------------------------------------------------------------------- #
def test_stale_resume_after_fails_with_286_from_watch(srv, coll):
    tokens = srv.insert_many(DB, COLL, [{"_id": n} for n in range(5)])
    oldest = srv.lose_history(keep_last=2)
    assert oldest == srv.events()[0]["clusterTime"]
    with coll.watch(resume_after=tokens[3]) as stream:  # still retained
        assert [e["fullDocument"]["_id"] for e in drain(stream)] == [4]
    with pytest.raises(OperationFailure) as info:
        coll.watch(resume_after=tokens[1])
    error = info.value
    assert error.code == 286
    assert error.has_error_label("NonResumableChangeStreamError")
    assert error.details["codeName"] == "ChangeStreamHistoryLost"
    assert error.details["errmsg"] == (
        "Resume of change stream was not possible, as the resume point may no longer be in "
        "the oplog."
    )
    assert len(stages(srv)) == 2, "286 is not retried"
    with pytest.raises(OperationFailure) as info:
        coll.watch(start_at_operation_time=Timestamp(oldest.time - 1, 0))
    assert info.value.code == 286


def test_open_cursor_fails_with_286_when_its_position_falls_off(srv, coll):
    with coll.watch() as stream:
        srv.insert_many(DB, COLL, [{"_id": n} for n in range(3)])
        srv.lose_history()
        with pytest.raises(OperationFailure) as info:
            stream.try_next()
        assert info.value.code == 286
        assert info.value.has_error_label("NonResumableChangeStreamError")
        assert not stream.alive
    assert len(srv.commands("aggregate")) == 1, "pymongo does not resume a 286"


def test_truncate_before_a_token(srv, coll):
    tokens = srv.insert_many(DB, COLL, [{"_id": n} for n in range(4)])
    srv.truncate_before(tokens[2])
    assert [e["documentKey"]["_id"] for e in srv.events()] == [2, 3]
    with coll.watch(resume_after=tokens[2]) as stream:
        assert [e["fullDocument"]["_id"] for e in drain(stream)] == [3]
    with pytest.raises(OperationFailure):
        coll.watch(resume_after=tokens[1])


# --------------------------------------------------------------------------------------- #
# Errors, labels and the driver's automatic resume
# --------------------------------------------------------------------------------------- #
def test_driver_resumes_after_a_labeled_get_more_error_without_loss_or_duplicates(srv, coll):
    tokens = srv.insert_many(DB, COLL, [{"_id": n} for n in range(2)])
    with coll.watch(resume_after=tokens[0], batch_size=2) as stream:
        later = srv.insert_many(DB, COLL, [{"_id": n} for n in range(2, 9)])
        got = [stream.try_next()["fullDocument"]["_id"] for _ in range(2)]
        srv.fail_next("getMore", 6)
        got += [e["fullDocument"]["_id"] for e in drain(stream)]
    assert got == list(range(1, 9))
    resumed = stages(srv)[1]
    # Events 2 and 3 came in one getMore batch; the failing getMore came after 3.
    assert resumed == {"resumeAfter": later[1]}, "resumes after the last token it handed out"
    assert srv.killed_cursors, "pymongo kills the failed cursor before resuming"


@pytest.mark.parametrize("code,resumed", [(6, True), (91, True), (43, True), (2, False)])
def test_which_get_more_errors_the_driver_resumes(srv, coll, code, resumed):
    with coll.watch() as stream:
        srv.insert(DB, COLL, {"_id": 1})
        srv.fail_next("getMore", code)
        if resumed:
            assert stream.try_next()["fullDocument"]["_id"] == 1
            assert len(srv.commands("aggregate")) == 2
        else:
            with pytest.raises(OperationFailure) as info:
                stream.try_next()
            assert info.value.code == 2
            assert info.value.details["codeName"] == "BadValue"
            assert not info.value.details.get("errorLabels")
            assert not stream.alive


def test_injected_errors_carry_real_labels(srv, client):
    srv.insert(DB, COLL, {"_id": 1})
    reply = client[DB].command("aggregate", COLL, pipeline=[{"$changeStream": {}}], cursor={})
    for code, name, label in [
        (6, "HostUnreachable", "ResumableChangeStreamError"),
        (262, "ExceededTimeLimit", "ResumableChangeStreamError"),
        (280, "ChangeStreamFatalError", "NonResumableChangeStreamError"),
    ]:
        srv.fail_next("getMore", code)
        with pytest.raises(OperationFailure) as info:
            client[DB].command("getMore", reply["cursor"]["id"], collection=COLL)
        assert info.value.details["codeName"] == name
        assert info.value.details["errorLabels"] == [label]
    with pytest.raises(OperationFailure) as info:
        client[DB].command("getMore", reply["cursor"]["id"], collection=COLL)
    assert info.value.code == 43, "a failed getMore destroys its cursor"


def test_initial_aggregate_is_retried_once_by_retryable_reads(srv, coll):
    srv.fail_next("aggregate", 6)
    with coll.watch() as stream:
        assert stream.alive
    assert len(srv.commands("aggregate")) == 2
    srv.reset()
    srv.fail_next("aggregate", 6, times=2)
    with pytest.raises(OperationFailure) as info:
        coll.watch()
    assert info.value.has_error_label("ResumableChangeStreamError")


def test_driver_resumes_after_a_dropped_connection(srv, coll):
    with coll.watch() as stream:
        srv.insert(DB, COLL, {"_id": 1})
        srv.hang_up_next("getMore")
        srv.insert(DB, COLL, {"_id": 2})
        assert [e["fullDocument"]["_id"] for e in drain(stream)] == [1, 2]
    assert len(srv.commands("aggregate")) == 2


# --------------------------------------------------------------------------------------- #
# Invalidation
# --------------------------------------------------------------------------------------- #
@pytest.mark.parametrize("ddl", ["drop", "rename"])
def test_drop_or_rename_sends_the_event_then_invalidate(srv, coll, ddl):
    srv.insert(DB, COLL, {"_id": 1})
    with coll.watch([{"$match": {"operationType": "insert"}}]) as stream:
        srv.insert(DB, COLL, {"_id": 2})
        if ddl == "drop":
            srv.drop_collection(DB, COLL)
        else:
            srv.rename_collection(DB, COLL, "archive")
        events = drain(stream)
        assert not stream.alive
    # The user's $match drops the DDL event, but never the invalidate.
    assert [e["operationType"] for e in events] == ["insert", "invalidate"]
    assert set(events[1]) == {"_id", "operationType", "clusterTime", "wallTime"}
    unfiltered = srv.events(DB, COLL)
    assert [e["operationType"] for e in unfiltered][-2:] == [ddl, "invalidate"]
    if ddl == "rename":
        assert unfiltered[-2]["to"] == {"db": DB, "coll": "archive"}
        assert srv.document(DB, "archive", 1) == {"_id": 1}


def test_invalidate_closes_the_server_cursor(srv, client):
    srv.insert(DB, COLL, {"_id": 1})
    reply = client[DB].command("aggregate", COLL, pipeline=[{"$changeStream": {}}], cursor={})
    _, invalidate = srv.drop_collection(DB, COLL)
    more = client[DB].command("getMore", reply["cursor"]["id"], collection=COLL)
    assert more["cursor"]["id"] == 0
    assert more["cursor"]["nextBatch"][-1]["operationType"] == "invalidate"
    assert more["cursor"]["postBatchResumeToken"] == invalidate["_id"]
    assert not srv.open_cursors


# --------------------------------------------------------------------------------------- #
# Oplog start, bulk and threads
# --------------------------------------------------------------------------------------- #
def test_oplog_start_find(srv, client):
    oplog = client.local["oplog.rs"]
    first = oplog.find_one({}, sort=[("$natural", 1)])
    assert first["op"] == "n" and first["ts"] == srv.oldest_retained
    srv.insert_many(DB, COLL, [{"_id": n} for n in range(3)])
    srv.lose_history(keep_last=1)
    assert oplog.find_one({}, sort=[("$natural", 1)])["ts"] == srv.events()[0]["clusterTime"]
    assert oplog.find_one({}, sort=[("$natural", -1)])["ts"] == srv.cluster_time
    assert oplog.find_one({}, {"ts": 1}, sort=[("$natural", -1)]) == {"ts": srv.cluster_time}
    assert list(oplog.find({})) == [], "only the first / last entry is modelled"
    assert client[DB][COLL].find_one({"_id": 1}) == {"_id": 1}, "others read the documents"
    find = srv.commands("find")[0]
    assert find["sort"] == {"$natural": 1} and find["limit"] == 1


def test_twenty_thousand_events(srv, coll):
    started = time.perf_counter()
    tokens = srv.insert_many(DB, COLL, ({"_id": n, "n": n} for n in range(20_000)))
    appended = time.perf_counter() - started
    started = time.perf_counter()
    with coll.watch(start_at_operation_time=srv.oldest_retained, batch_size=1000) as stream:
        ids = [stream.try_next()["fullDocument"]["_id"] for _ in range(20_000)]
        assert stream.resume_token == tokens[-1]
        assert stream.try_next() is None
    read = time.perf_counter() - started
    print(f"\n20,000 events: appended in {appended:.3f} s, read back in {read:.3f} s")
    assert ids == list(range(20_000))


def test_appending_from_another_thread_while_a_consumer_reads(srv, coll):
    def produce() -> None:
        for n in range(500):
            srv.insert(DB, COLL, {"_id": n})

    received: list[int] = []
    with coll.watch(max_await_time_ms=10) as stream:
        producer = threading.Thread(target=produce)
        producer.start()
        deadline = time.monotonic() + 20
        while len(received) < 500 and time.monotonic() < deadline:
            event = stream.try_next()
            if event is not None:
                received.append(event["fullDocument"]["_id"])
        producer.join()
    assert received == list(range(500))


def test_reset_forgets_everything(srv, client):
    srv.insert(DB, COLL, {"_id": 1})
    client[DB].command("aggregate", COLL, pipeline=[{"$changeStream": {}}], cursor={})
    srv.fail_next("getMore", 6)
    srv.reset()
    assert srv.events() == [] and srv.open_cursors == [] and srv.commands() == []
    assert srv.document(DB, COLL, 1) is None
    srv.insert(DB, COLL, {"_id": 1})


def test_start_needs_mockupdb(monkeypatch):
    monkeypatch.setitem(sys.modules, "mockupdb", None)
    with pytest.raises(ImportError, match=r"pip install mockupdb==1\.8\.1"):
        ScriptedReplicaSet().start()


# --------------------------------------------------------------------------------------- #
# Reading the current documents (initial sync): find, getMore, counts, aggregates, seed
# --------------------------------------------------------------------------------------- #
def ids(docs: Any) -> list[Any]:
    return [doc["_id"] for doc in docs]


def test_find_filter_sort_skip_limit_and_projection(srv, coll):
    srv.seed(
        DB,
        COLL,
        [
            {"_id": 1, "kind": "a", "n": 5, "meta": {"by": "x", "at": 1}},
            {"_id": 2, "kind": "b", "n": 3, "meta": {"by": "y", "at": 2}},
            {"_id": 3, "kind": "a", "n": 3, "meta": {"by": "z", "at": 3}},
            {"_id": 4, "kind": "a", "n": 9},
            {"_id": 5, "kind": "c", "n": "text"},
        ],
    )
    assert ids(coll.find({"kind": "a"})) == [1, 3, 4]
    assert ids(coll.find({"kind": {"$in": ["b", "c"]}}).sort("_id", -1)) == [5, 2]
    # Range operators are type-bracketed: the string "text" is not >= 3.
    assert ids(coll.find({"n": {"$gte": 3, "$lt": 9}}).sort("_id", -1)) == [3, 2, 1]
    # Several fields; numbers order before strings.
    assert ids(coll.find().sort([("n", 1), ("_id", -1)])) == [3, 2, 1, 4, 5]
    assert ids(coll.find().sort([("kind", -1), ("n", 1)])) == [5, 2, 3, 1, 4]
    assert ids(coll.find().sort("_id", 1).skip(1).limit(2)) == [2, 3]
    assert ids(coll.find({"kind": "a"}).sort("n", -1).skip(2)) == [3]
    assert list(coll.find({"_id": 1}, {"kind": 1})) == [{"_id": 1, "kind": "a"}]
    assert coll.find_one({"_id": 1}, {"kind": 1, "meta.by": 1, "_id": 0}) == {
        "kind": "a",
        "meta": {"by": "x"},
    }
    assert coll.find_one({"_id": 2}, {"meta": 0, "n": 0}) == {"_id": 2, "kind": "b"}
    assert coll.find_one({"kind": "zzz"}) is None
    find = srv.commands("find")[5]
    assert {key: find.get(key) for key in ("find", "filter", "sort", "skip", "limit")} == {
        "find": COLL,
        "filter": {},
        "sort": {"_id": 1},
        "skip": 1,
        "limit": 2,
    }


def test_sort_follows_the_bson_type_and_value_order(srv, coll):
    earlier = datetime(2024, 1, 1, tzinfo=UTC)
    srv.seed(
        DB,
        COLL,
        [
            {"_id": "d2", "v": earlier + timedelta(days=1)},
            {"_id": "s2", "v": "a"},
            {"_id": "t", "v": True},
            {"_id": "n", "v": None},
            {"_id": "oid2", "v": ObjectId("000000000000000000000002")},
            {"_id": "i", "v": 10},
            {"_id": "arr", "v": [7, 0.5]},
            {"_id": "o", "v": {"x": 1}},
            {"_id": "l", "v": Int64(3)},
            {"_id": "F", "v": False},
            {"_id": "m"},
            {"_id": "s1", "v": "B"},
            {"_id": "f", "v": 2.5},
            {"_id": "oid1", "v": ObjectId("000000000000000000000001")},
            {"_id": "d1", "v": earlier.replace(tzinfo=None)},
        ],
    )
    # Missing and null tie (then _id); an array sorts by its smallest element ascending
    # and its largest descending; "B" < "a" (binary, no collation).
    ascending = ["m", "n", "arr", "f", "l", "i", "s1", "s2", "o", "oid1", "oid2", "F", "t"]
    assert ids(coll.find().sort("v", 1)) == [*ascending, "d1", "d2"]
    descending = ["d2", "d1", "t", "F", "oid2", "oid1", "o", "s2", "s1", "i", "arr", "l", "f"]
    assert ids(coll.find().sort("v", -1)) == [*descending, "m", "n"]
    assert ids(coll.find({"v": {"$gt": earlier}})) == ["d2"]


def test_find_without_sort_returns_the_record_order(srv, coll):
    srv.seed(DB, COLL, [{"_id": 3}, {"_id": 1}])
    srv.insert(DB, COLL, {"_id": 2})
    srv.update(DB, COLL, 3, set_fields={"x": 1})
    assert ids(coll.find()) == [3, 1, 2], "insertion order; an update keeps the place"
    srv.delete(DB, COLL, 3)
    srv.insert(DB, COLL, {"_id": 3})
    assert ids(coll.find()) == [1, 2, 3], "a re-inserted document goes to the end"
    assert ids(coll.find(sort=[("$natural", -1)])) == [3, 2, 1]


def test_find_batches_through_get_more(srv, client, coll):
    srv.seed(DB, COLL, ({"_id": n} for n in range(10)))
    assert ids(coll.find(batch_size=3).sort("_id", 1)) == list(range(10))
    assert srv.commands("find")[0]["batchSize"] == 3
    assert [doc["batchSize"] for doc in srv.commands("getMore")] == [3, 3, 3]
    assert not srv.open_cursors, "the last batch closed the cursor"

    reply = client[DB].command("find", COLL, sort={"_id": 1}, batchSize=4)
    cursor = reply["cursor"]
    assert ids(cursor["firstBatch"]) == [0, 1, 2, 3]
    assert cursor["id"] != 0 and cursor["ns"] == f"{DB}.{COLL}"
    assert "postBatchResumeToken" not in cursor, "a find cursor is no change stream"
    assert isinstance(reply["operationTime"], Timestamp)
    assert srv.open_cursors == [cursor["id"]]
    more = client[DB].command("getMore", cursor["id"], collection=COLL, batchSize=4)["cursor"]
    assert ids(more["nextBatch"]) == [4, 5, 6, 7]
    assert more["id"] == cursor["id"] and "postBatchResumeToken" not in more
    # Without a batchSize a getMore returns everything left (up to 16 MiB).
    last = client[DB].command("getMore", cursor["id"], collection=COLL)["cursor"]
    assert ids(last["nextBatch"]) == [8, 9] and last["id"] == 0
    assert not srv.open_cursors
    with pytest.raises(OperationFailure) as info:
        client[DB].command("getMore", cursor["id"], collection=COLL)
    assert info.value.code == 43

    empty = client[DB].command("find", COLL, batchSize=0, skip=8)["cursor"]
    assert empty["firstBatch"] == [] and empty["id"] != 0, "batchSize 0 only opens the cursor"
    rest = client[DB].command("getMore", empty["id"], collection=COLL)["cursor"]
    assert ids(rest["nextBatch"]) == [8, 9] and rest["id"] == 0, "skip applies to the first read"
    single = client[DB].command("find", COLL, batchSize=2, singleBatch=True)["cursor"]
    assert ids(single["firstBatch"]) == [0, 1] and single["id"] == 0


def test_find_cursor_reads_each_batch_as_the_documents_are_then(srv, coll):
    srv.seed(DB, COLL, ({"_id": n, "v": 0} for n in (0, 2, 4, 6, 8)))
    cursor = coll.find(batch_size=2).sort("_id", 1)
    first = [next(cursor)["_id"], next(cursor)["_id"]]  # the first batch
    srv.insert(DB, COLL, {"_id": 1, "v": 0})  # behind the position: not seen
    srv.insert(DB, COLL, {"_id": 5, "v": 0})  # ahead: seen
    srv.delete(DB, COLL, 6)  # not returned yet: never returned
    srv.update(DB, COLL, 8, set_fields={"v": 1})  # returned as it is now
    rest = list(cursor)
    assert first == [0, 2]
    assert rest == [{"_id": 4, "v": 0}, {"_id": 5, "v": 0}, {"_id": 8, "v": 1}]
    assert len(srv.commands("getMore")) == 2

    # The same holds for a descending sort on another field (position = sort key + _id).
    cursor = coll.find({"v": 0}, batch_size=2).sort("_id", -1)
    assert [next(cursor)["_id"], next(cursor)["_id"]] == [5, 4]
    srv.insert(DB, COLL, {"_id": 3, "v": 0})
    srv.update(DB, COLL, 2, set_fields={"v": 2})  # updated out of the filter
    assert ids(cursor) == [3, 1, 0]


def test_kill_cursors_closes_a_find_cursor(srv, client, coll):
    srv.seed(DB, COLL, ({"_id": n} for n in range(10)))
    cursor = coll.find(batch_size=2)
    assert next(cursor)["_id"] == 0
    [cursor_id] = srv.open_cursors
    cursor.close()
    assert srv.killed_cursors == [cursor_id] and not srv.open_cursors
    assert srv.commands("killCursors")[0]["killCursors"] == COLL
    with pytest.raises(OperationFailure) as info:
        client[DB].command("getMore", Int64(cursor_id), collection=COLL)
    assert info.value.code == 43

    reply = client[DB].command("find", COLL, batchSize=2)
    opened = reply["cursor"]["id"]
    killed = client[DB].command("killCursors", COLL, cursors=[opened, Int64(12345)])
    assert killed["cursorsKilled"] == [opened] and killed["cursorsNotFound"] == [12345]


def test_unmodelled_find_options_are_refused(srv, coll):
    with pytest.raises(OperationFailure) as info:
        list(coll.find(cursor_type=CursorType.TAILABLE))
    assert info.value.code == 2 and "tailable" in str(info.value)
    with pytest.raises(OperationFailure) as info:
        coll.find_one({}, {"a": 1, "b": 0})
    assert info.value.code == 31254
    with pytest.raises(OperationFailure) as info:
        coll.find_one({"a": {"$regex": "^x"}})
    assert info.value.code == 2 and "$regex" in str(info.value)


def test_estimated_document_count_sends_count(srv, client, coll):
    assert coll.estimated_document_count() == 0
    srv.seed(DB, COLL, ({"_id": n, "n": n} for n in range(7)))
    srv.insert(DB, COLL, {"_id": 7, "n": 7})
    srv.delete(DB, COLL, 0)
    assert coll.estimated_document_count() == 7
    assert srv.commands("count")[-1]["count"] == COLL
    reply = client[DB].command("count", COLL, query={"n": {"$gt": 3}}, skip=1, limit=2)
    assert reply["n"] == 2


def test_count_documents_runs_a_match_and_group_aggregate(srv, client, coll):
    srv.seed(DB, COLL, ({"_id": n, "kind": "ab"[n % 2]} for n in range(9)))
    assert coll.count_documents({}) == 9
    assert coll.count_documents({"kind": "a"}) == 5
    assert coll.count_documents({"kind": "a"}, skip=1, limit=3) == 3
    assert coll.count_documents({"kind": "zzz"}) == 0
    assert client[DB]["empty"].count_documents({}) == 0
    assert srv.commands("aggregate")[1]["pipeline"] == [
        {"$match": {"kind": "a"}},
        {"$group": {"_id": 1, "n": {"$sum": 1}}},
    ]
    assert not srv.open_cursors and not srv.events()


def test_collection_aggregate_pipelines_and_batches(srv, coll):
    srv.seed(DB, COLL, ({"_id": n, "kind": "abc"[n % 3], "amount": n} for n in range(12)))
    grouped = coll.aggregate(
        [
            {"$match": {"amount": {"$gte": 3}}},
            {"$group": {"_id": "$kind", "total": {"$sum": "$amount"}, "count": {"$sum": 1}}},
            {"$sort": {"_id": -1}},
        ]
    )
    assert list(grouped) == [
        {"_id": "c", "total": 24, "count": 3},
        {"_id": "b", "total": 21, "count": 3},
        {"_id": "a", "total": 18, "count": 3},
    ]
    page = coll.aggregate(
        [
            {"$sort": {"amount": -1}},
            {"$skip": 2},
            {"$limit": 5},
            {"$project": {"amount": 1, "_id": 0}},
        ],
        batchSize=2,
    )
    assert list(page) == [{"amount": a} for a in (9, 8, 7, 6, 5)]
    assert len(srv.commands("getMore")) == 2, "5 results in batches of 2"
    assert list(coll.aggregate([{"$match": {"kind": "a"}}, {"$count": "n"}])) == [{"n": 4}]


@pytest.mark.parametrize(
    "pipeline,code,words",
    [
        (
            [{"$lookup": {"from": "x", "localField": "a", "foreignField": "b", "as": "c"}}],
            40324,
            "'$lookup' (ScriptedReplicaSet evaluates only $match, $group",
        ),
        ([{"$group": {"_id": None, "avg": {"$avg": "$n"}}}], 2, "accumulator '$avg'"),
        ([{"$match": {}}, {"$changeStream": {}}], 40602, "only valid as the first stage"),
        ([{"$limit": 0}], 15958, "the limit must be positive"),
    ],
)
def test_unsupported_collection_aggregates_are_refused(srv, coll, pipeline, code, words):
    srv.seed(DB, COLL, [{"_id": 1, "n": 1}])
    with pytest.raises(OperationFailure) as info:
        list(coll.aggregate(pipeline))
    assert info.value.code == code
    assert words in info.value.details["errmsg"]
    assert not info.value.details.get("errorLabels")
    assert len(srv.commands("aggregate")) == 1, "not retried"


def test_read_concern_is_accepted_and_snapshot_reads_get_a_cluster_time(srv, client):
    srv.seed(DB, COLL, [{"_id": 1}, {"_id": 2}])
    majority = client[DB].get_collection(COLL, read_concern=ReadConcern("majority"))
    assert ids(majority.find()) == [1, 2]
    assert majority.count_documents({}) == 2
    assert srv.commands("find")[-1]["readConcern"] == {"level": "majority"}
    coll = client[DB][COLL]
    with client.start_session(snapshot=True) as session:
        assert ids(coll.find(session=session)) == [1, 2]
        srv.insert(DB, COLL, {"_id": 3})  # ignored: reads see the current documents
        assert coll.count_documents({}, session=session) == 3
    [find] = [doc for doc in srv.commands("find") if doc["readConcern"]["level"] == "snapshot"]
    assert find["readConcern"] == {"level": "snapshot"}
    at = srv.commands("aggregate")[-1]["readConcern"]
    assert at["level"] == "snapshot" and isinstance(at["atClusterTime"], Timestamp)


def test_seed_stores_documents_without_change_events(srv, coll):
    with coll.watch(
        start_at_operation_time=srv.oldest_retained, full_document_before_change="whenAvailable"
    ) as stream:
        clock = srv.cluster_time
        seeded = srv.seed(DB, COLL, [{"_id": 1, "n": 1}, {"n": 2}])
        assert seeded[0] == 1 and isinstance(seeded[1], ObjectId)
        assert srv.cluster_time == clock, "seeding writes no oplog entry"
        assert stream.try_next() is None
        srv.update(DB, COLL, 1, set_fields={"n": 10})
        [update] = drain(stream)
    assert update["fullDocumentBeforeChange"] == {"_id": 1, "n": 1}
    assert [e["operationType"] for e in srv.events()] == ["update"]
    assert [doc["n"] for doc in coll.find().sort("_id", 1)] == [10, 2], "ints before ObjectIds"
    assert srv.documents(DB, COLL) == [{"_id": 1, "n": 10}, {"_id": seeded[1], "n": 2}]
    with pytest.raises(ValueError, match="duplicate"):
        srv.seed(DB, COLL, [{"_id": 3}, {"_id": 1}])
    with pytest.raises(ValueError, match="duplicate"):
        srv.seed(DB, COLL, [{"_id": 4}, {"_id": 4}])
    assert srv.document(DB, COLL, 3) is None and srv.document(DB, COLL, 4) is None


def test_ten_thousand_seeded_documents(srv, coll):
    started = time.perf_counter()
    srv.seed(DB, COLL, ({"_id": n, "n": n, "tag": "x"} for n in range(10_000)))
    seeded = time.perf_counter() - started
    started = time.perf_counter()
    got = ids(coll.find(batch_size=1000).sort("_id", 1))
    read = time.perf_counter() - started
    print(f"\n10,000 documents: seeded in {seeded:.3f} s, read back in {read:.3f} s")
    assert got == list(range(10_000))
    assert coll.estimated_document_count() == 10_000
    assert coll.count_documents({"n": {"$lt": 2500}}) == 2500
    assert not srv.events()


def test_paging_while_another_thread_inserts(srv, coll):
    srv.seed(DB, COLL, ({"_id": n} for n in range(2000)))
    stop = threading.Event()

    def produce() -> None:
        for n in range(2000, 4000):
            if stop.is_set():
                return
            srv.insert(DB, COLL, {"_id": n})

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        got = ids(coll.find(batch_size=50).sort("_id", 1))
    finally:
        stop.set()
        producer.join()
    assert got == list(range(len(got))), "in order, without gaps or duplicates"
    assert len(got) >= 2000


# --------------------------------------------------------------------------------------- #
# The command-line server
# --------------------------------------------------------------------------------------- #
def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            raise AssertionError(f"no output within {timeout} s")
    return proc.stdout.readline()


@contextmanager
def _cli_server(*args: str) -> Iterator[str]:
    """Run the CLI server with *args*; yield its URI; expect a clean exit on SIGTERM."""
    command = [sys.executable, "-m", "flowwarden_django.testkit.scripted_mongo", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        line = _read_line(proc, timeout=30)
        assert line.startswith("READY mongodb://localhost:"), line
        uri = line.split()[1]
        assert uri.endswith("/?replicaSet=rs0")
        yield uri
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.subprocess
def test_cli_serves_until_sigterm():
    with (
        _cli_server("--port", "0", "--events", "30", "--feed-rate", "200") as uri,
        pymongo.MongoClient(uri, serverSelectionTimeoutMS=5000) as mongo,
    ):
        oldest = mongo.local["oplog.rs"].find_one({}, sort=[("$natural", 1)])["ts"]
        seqs: list[int] = []
        with mongo.app.orders.watch(start_at_operation_time=oldest) as stream:
            deadline = time.monotonic() + 20
            while len(seqs) < 60 and time.monotonic() < deadline:
                event = stream.try_next()  # None while waiting for the feeder
                if event is not None:
                    seqs.append(event["fullDocument"]["seq"])
    assert seqs == list(range(1, 61)), "preloaded events, then the fed ones, in order"


@pytest.mark.subprocess
def test_cli_seeds_documents_without_events():
    with (
        _cli_server("--seed", "5", "--events", "3") as uri,
        pymongo.MongoClient(uri, serverSelectionTimeoutMS=5000) as mongo,
    ):
        orders = mongo.app.orders
        assert [doc["seq"] for doc in orders.find().sort("_id", 1)] == list(range(1, 9))
        assert orders.estimated_document_count() == 8
        oldest = mongo.local["oplog.rs"].find_one({}, sort=[("$natural", 1)])["ts"]
        with orders.watch(start_at_operation_time=oldest) as stream:
            seqs = [event["fullDocument"]["seq"] for event in drain(stream)]
    assert seqs == [6, 7, 8], "only the logged inserts are events; the seeded are not"
