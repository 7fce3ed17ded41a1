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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mockupdb", reason="the scripted MongoDB fake needs mockupdb==1.8.1")

import pymongo
from bson import Timestamp
from pymongo.errors import OperationFailure

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
    fake = ScriptedReplicaSet(start_time=datetime(2024, 1, 1, tzinfo=UTC))  # never started
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
    srv.idle_wait = 1.0
    try:
        with coll.watch(max_await_time_ms=1000) as stream:
            timer = threading.Timer(0.05, srv.insert, args=(DB, COLL, {"_id": "late"}))
            timer.start()
            started = time.monotonic()
            event = stream.try_next()
            timer.join()
        assert event is not None and event["documentKey"] == {"_id": "late"}
        assert time.monotonic() - started < 0.9
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
        ([{"$match": {"fullDocument.n": {"$gt": 1}}}], 2),
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
    assert client[DB][COLL].find_one({"_id": 1}) is None, "other finds: an empty batch"
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
# The command-line server
# --------------------------------------------------------------------------------------- #
def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            raise AssertionError(f"no output within {timeout} s")
    return proc.stdout.readline()


def test_cli_serves_until_sigterm():
    command = [
        sys.executable,
        "-m",
        "flowwarden_django.testkit.scripted_mongo",
        "--port",
        "0",
        "--events",
        "30",
        "--feed-rate",
        "200",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        line = _read_line(proc, timeout=30)
        assert line.startswith("READY mongodb://localhost:"), line
        uri = line.split()[1]
        assert uri.endswith("/?replicaSet=rs0")
        with pymongo.MongoClient(uri, serverSelectionTimeoutMS=5000) as mongo:
            oldest = mongo.local["oplog.rs"].find_one({}, sort=[("$natural", 1)])["ts"]
            seqs: list[int] = []
            with mongo.app.orders.watch(start_at_operation_time=oldest) as stream:
                deadline = time.monotonic() + 20
                while len(seqs) < 60 and time.monotonic() < deadline:
                    event = stream.try_next()  # None while waiting for the feeder
                    if event is not None:
                        seqs.append(event["fullDocument"]["seq"])
        assert seqs == list(range(1, 61)), "preloaded events, then the fed ones, in order"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
