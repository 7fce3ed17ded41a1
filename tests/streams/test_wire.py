"""Lanes (b) and (c): the stream runtime with the real pymongo driver on the wire.

Every scenario runs a ``StreamConsumer`` over the production source
(``clients.pymongo_source``: the ``FLOWWARDEN["MONGO_CLIENTS"]`` alias, the stream's
collection, ``STREAM_MAX_AWAIT_MS``) and asserts on three things: the checkpoint
store's data, the events the handler saw, and the commands pymongo sent. The commands
are recorded with pymongo's own command monitoring (``Wire``), so the same assertions
hold on both servers.

* Lane (b), always on: ``ScriptedReplicaSet``, the mockupdb-based fake primary of
  ``flowwarden_django.testkit.scripted_mongo``. It proves that the runtime and pymongo
  agree on the wire (options, resume tokens, PBRT rules, auto-resume, error classes);
  it proves nothing about what a real server answers.
* Lane (c), opt-in: the same scenario functions against a real replica set at
  ``FLOWWARDEN_TEST_MONGO_URL`` (one fresh database per module, dropped afterwards, one
  collection per test). Skipped with a reason when the variable is unset.

Scenarios taking the ``server`` fixture run on both lanes. Those taking ``scripted``
need something a real server cannot do on demand (truncating its history, injecting
a command failure or a dropped connection) and run on the scripted lane only; each
says so in its docstring.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pytest
from django.conf import settings
from django.db import DatabaseError
from django.test import override_settings
from django.utils import timezone
from pymongo import MongoClient, monitoring
from pymongo.errors import OperationFailure
from pymongo.write_concern import WriteConcern

from flowwarden_django.streams import Checkpoint
from flowwarden_django.streams.backends.memory import InMemoryCheckpointStore
from flowwarden_django.streams.clients import pymongo_source
from flowwarden_django.streams.runtime import (
    HistoryLostError,
    StreamConsumer,
    StreamInvalidatedError,
    StreamState,
)
from flowwarden_django.streams.source import is_history_lost
from flowwarden_django.streams.spec import CheckpointSpec, RestartPolicySpec, StreamSpec
from flowwarden_django.streams.tokens import Token
from tests.support.lanes import lane_marks, on_lane
from tests.support.services import unavailable_reason

STREAM = "orders"
MAIN_COMMENT = f"flowwarden:{STREAM}"
BOOTSTRAP_COMMENT = f"flowwarden:bootstrap:{STREAM}"
MAX_AWAIT_MS = 50
#: Longest wait for something the consumer thread does (generous for the live lane).
WAIT = 15.0
#: Tiny restart backoff; a bounded number of attempts so a wrong error code fails the
#: test instead of restarting for ever.
FAST_RESTART = RestartPolicySpec(max_attempts=3, initial_delay="10ms", max_delay="50ms")

When = datetime | None


# -- what the driver sent -------------------------------------------------------------------


@dataclasses.dataclass
class Sent:
    """One command pymongo sent, with its reply or its failure."""

    name: str
    command: dict[str, Any]
    at: float
    reply: dict[str, Any] | None = None
    failure: dict[str, Any] | None = None

    @property
    def comment(self) -> Any:
        return self.command.get("comment")

    @property
    def stage(self) -> dict[str, Any]:
        """The ``$changeStream`` stage of an aggregate."""
        return self.command["pipeline"][0]["$changeStream"]

    @property
    def pbrt(self) -> Mapping[str, Any] | None:
        return ((self.reply or {}).get("cursor") or {}).get("postBatchResumeToken")

    @property
    def batch(self) -> list[Mapping[str, Any]]:
        cursor = (self.reply or {}).get("cursor") or {}
        return list(cursor.get("firstBatch", cursor.get("nextBatch", [])))


class Wire(monitoring.CommandListener):
    """Every command the consumer's client sent, in order (pymongo command monitoring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent: list[Sent] = []
        self._pending: dict[tuple[Any, int], Sent] = {}

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        sent = Sent(event.command_name, copy.deepcopy(dict(event.command)), time.monotonic())
        with self._lock:
            self.sent.append(sent)
            self._pending[(event.connection_id, event.request_id)] = sent

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        with self._lock:
            sent = self._pending.pop((event.connection_id, event.request_id), None)
        if sent is not None:
            sent.reply = copy.deepcopy(dict(event.reply))

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        with self._lock:
            sent = self._pending.pop((event.connection_id, event.request_id), None)
        if sent is not None:
            sent.failure = copy.deepcopy(dict(event.failure))

    def clear(self) -> None:
        with self._lock:
            self.sent.clear()

    def commands(self, name: str, comment: str | None = None) -> list[Sent]:
        with self._lock:
            sent = list(self.sent)
        return [s for s in sent if s.name == name and (comment is None or s.comment == comment)]

    def streams(self) -> list[Sent]:
        """The main cursor's aggregates: the opens and pymongo's own resumes."""
        return self.commands("aggregate", MAIN_COMMENT)

    def bootstraps(self) -> list[Sent]:
        """The batchSize-0 aggregates that capture a fresh position."""
        return self.commands("aggregate", BOOTSTRAP_COMMENT)

    def polls(self) -> list[Sent]:
        return self.commands("getMore", MAIN_COMMENT)

    def last_pbrt(self) -> Mapping[str, Any] | None:
        """The postBatchResumeToken of the main cursor's latest reply."""
        replies = [s for s in self.streams() + self.polls() if s.pbrt is not None]
        return max(replies, key=lambda s: s.at).pbrt if replies else None

    def delivered(self, operation: str) -> list[Mapping[str, Any]]:
        """Events of *operation* the server returned on the main cursor."""
        return [
            event
            for sent in sorted(self.streams() + self.polls(), key=lambda s: s.at)
            for event in sent.batch
            if event.get("operationType") == operation
        ]


# -- the two servers ---------------------------------------------------------------------------


class Server:
    """What a scenario needs from MongoDB, on either lane."""

    lane: str
    uri: str
    db: str
    coll: str
    wire: Wire

    def insert(self, *ids: int) -> None:
        raise NotImplementedError

    def drop(self) -> None:
        raise NotImplementedError

    def rename(self, to: str) -> None:
        raise NotImplementedError

    def nudge(self) -> None:
        """Move the cluster time without touching the watched collection."""


class ScriptedServer(Server):
    """Lane (b): a ``ScriptedReplicaSet`` shared by the module, reset for each test."""

    lane = "scripted"

    def __init__(self, srv: Any) -> None:
        self.srv = srv
        self.uri = srv.uri
        self.db, self.coll = "app", "orders"

    def insert(self, *ids: int) -> None:
        for n in ids:
            self.srv.insert(self.db, self.coll, {"_id": n, "n": n})

    def drop(self) -> None:
        self.srv.drop_collection(self.db, self.coll)

    def rename(self, to: str) -> None:
        self.srv.rename_collection(self.db, self.coll, to)

    def nudge(self) -> None:
        pass  # every idle getMore moves the fake's clock, like the server's no-op writer

    def lose_history(self, keep_last: int = 0) -> Any:
        """Truncate the oplog to its newest *keep_last* events; returns its oldest time."""
        return self.srv.lose_history(keep_last)


class LiveServer(Server):
    """Lane (c): a real replica set; a new collection per test in the module's database."""

    lane = "live"

    def __init__(self, uri: str, client: MongoClient, db: str) -> None:
        self.uri, self.db = uri, db
        self.coll = f"orders_{uuid.uuid4().hex[:10]}"
        # Majority writes: a change stream only returns majority-committed events, so
        # an event is visible to the consumer's next poll once insert() has returned.
        self._db = client.get_database(db, write_concern=WriteConcern("majority"))
        self._db.create_collection(self.coll)
        self._last_nudge = 0.0

    def insert(self, *ids: int) -> None:
        self._db[self.coll].insert_many([{"_id": n, "n": n} for n in ids])

    def drop(self) -> None:
        self._db[self.coll].drop()

    def rename(self, to: str) -> None:
        self._db[self.coll].rename(f"{to}_{uuid.uuid4().hex[:6]}")

    def nudge(self) -> None:
        # A write elsewhere advances the oplog, hence an idle stream's PBRT, without
        # waiting for the server's periodic no-op (about every 10 s).
        if time.monotonic() - self._last_nudge >= 0.05:
            self._db["fw_nudge"].insert_one({"at": time.time()})
            self._last_nudge = time.monotonic()


@pytest.fixture(scope="module")
def _scripted_rs() -> Iterator[Any]:
    pytest.importorskip("mockupdb", reason="the scripted MongoDB fake needs mockupdb==1.8.1")
    from flowwarden_django.testkit.scripted_mongo import ScriptedReplicaSet

    # One server per module: mockupdb's stop() takes about a second.
    with ScriptedReplicaSet() as srv:
        yield srv


@pytest.fixture(scope="module")
def _live_db() -> Iterator[tuple[str, MongoClient, str]]:
    reason = unavailable_reason("mongo_live")
    if reason is not None:
        pytest.skip(reason)
    uri = os.environ["FLOWWARDEN_TEST_MONGO_URL"]
    client: MongoClient = MongoClient(uri, serverSelectionTimeoutMS=10_000)
    name = f"fw_wire_{uuid.uuid4().hex[:12]}"
    try:
        yield uri, client, name
    finally:
        client.drop_database(name)
        client.close()


@contextmanager
def _wired(server: Server) -> Iterator[Server]:
    """Point the ``default`` client alias at *server*, with a ``Wire`` and short polls."""
    server.wire = Wire()
    options = {"event_listeners": [server.wire], "serverSelectionTimeoutMS": 5000}
    fw = {
        **settings.FLOWWARDEN,
        "MONGO_CLIENTS": {"default": {"URL": server.uri, "OPTIONS": options}},
        "STREAM_MAX_AWAIT_MS": MAX_AWAIT_MS,
    }
    with override_settings(FLOWWARDEN=fw):  # closes the alias's client on the way out
        yield server


def _make(request: pytest.FixtureRequest, lane: str) -> Iterator[Any]:
    if lane == "scripted":
        srv = request.getfixturevalue("_scripted_rs")
        srv.reset()
        with _wired(ScriptedServer(srv)) as server:
            yield server
        assert not srv.internal_errors, srv.internal_errors[0]
    else:
        with _wired(LiveServer(*request.getfixturevalue("_live_db"))) as server:
            yield server


@pytest.fixture(params=["scripted", pytest.param("live", marks=lane_marks("mongo_live"))])
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    """The scenario's server: lane (b) always, lane (c) when FLOWWARDEN_TEST_MONGO_URL is set."""
    yield from _make(request, request.param)


@pytest.fixture
def scripted(request: pytest.FixtureRequest) -> Iterator[ScriptedServer]:
    """Lane (b) only: for scenarios that truncate history or inject faults."""
    yield from _make(request, "scripted")


@pytest.fixture
def live(request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    """Lane (c) only."""
    yield from _make(request, "live")


# -- streams, stores, consumers ----------------------------------------------------------------


@dataclasses.dataclass
class Write:
    """One partial write to the store, and the runtime function that made it."""

    method: str
    caller: str
    args: tuple[Any, ...]
    wire_position: int


def writer(frame: Any) -> str:
    """The runtime function that made a store call from *frame*: the consumer core's
    decision being driven (``open_stream``, ``history_lost``, ``on_idle``...), else
    the calling function."""
    while frame is not None:
        if frame.f_code.co_name in ("drive", "adrive") and "decision" in frame.f_locals:
            decision = frame.f_locals["decision"]
            while getattr(decision, "gi_yieldfrom", None) is not None:
                decision = decision.gi_yieldfrom
            return decision.gi_code.co_name
        if not frame.f_code.co_filename.endswith("observed_store.py"):  # the metrics wrapper
            caller = frame.f_code.co_name
            if caller not in ("_perform",):
                return caller
        frame = frame.f_back
    return "?"


class RecordingStore(InMemoryCheckpointStore):
    """The in-memory store, logging every anchor write (and what the wire looked like)."""

    def __init__(self, wire: Wire) -> None:
        super().__init__()
        self.wire = wire
        self.writes: list[Write] = []
        self.after_write: Callable[[Write], None] | None = None

    def _log(self, method: str, *args: Any) -> Write:
        write = Write(method, writer(sys._getframe(2)), args, len(self.wire.sent))
        self.writes.append(write)
        return write

    def _done(self, write: Write) -> None:
        if self.after_write is not None:
            self.after_write(write)

    def of(self, method: str) -> list[Write]:
        return [w for w in self.writes if w.method == method]

    def save_seen(
        self, stream_name: str, token: Token | None, at: datetime | None, heartbeat_at: When = None
    ) -> None:
        write = self._log("save_seen", stream_name, token, at, heartbeat_at)
        super().save_seen(stream_name, token, at, heartbeat_at)
        self._done(write)

    def save_processed(
        self, stream_name: str, token: Token | None, at: datetime | None, heartbeat_at: When = None
    ) -> None:
        write = self._log("save_processed", stream_name, token, at, heartbeat_at)
        super().save_processed(stream_name, token, at, heartbeat_at)
        self._done(write)

    def save_heartbeat(self, stream_name: str, at: datetime) -> None:
        write = self._log("save_heartbeat", stream_name, at)
        super().save_heartbeat(stream_name, at)
        self._done(write)

    def reset_after_history_lost(
        self, stream_name: str, fresh: Token | None, dead: Token | None, at: datetime
    ) -> None:
        write = self._log("reset_after_history_lost", stream_name, fresh, dead, at)
        super().reset_after_history_lost(stream_name, fresh, dead, at)
        self._done(write)


class Seen:
    """A handler recording what it was given, in order."""

    def __init__(self) -> None:
        self.ids: list[Any] = []
        self.tokens: list[Mapping[str, Any]] = []
        self.operations: list[str] = []

    def __call__(self, doc: Mapping[str, Any], ctx: Any) -> None:
        self.ids.append(doc["_id"])
        self.tokens.append(ctx.resume_token)

    def on_change(self, ctx: Any) -> None:
        self.operations.append(ctx.operation_type)


def stream(
    server: Server,
    handler: Callable[..., Any] | None = None,
    *,
    checkpoint: CheckpointSpec | None = None,
    restart: RestartPolicySpec = FAST_RESTART,
    **options: Any,
) -> StreamSpec:
    return StreamSpec(
        name=STREAM,
        collection=server.coll,
        database=server.db,
        handlers={"insert": handler or Seen()},
        checkpoint=checkpoint or CheckpointSpec(),
        restart_policy=restart,
        **options,
    )


def consumer(spec: StreamSpec, store: Any) -> StreamConsumer:
    """A consumer on the production source (``clients.pymongo_source``)."""
    return StreamConsumer(spec, store, pymongo_source)


def burst(spec: StreamSpec, store: Any) -> StreamConsumer:
    """Run until caught up; the consumer is returned for its counters."""
    running = consumer(spec, store)
    running.run(burst=True)
    return running


class Background:
    """Runs ``consumer.run()`` on its own thread; leaving the block stops and joins it."""

    def __init__(self, running: StreamConsumer) -> None:
        self.consumer = running
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="wire-consumer", daemon=True)

    def _run(self) -> None:
        try:
            self.consumer.run()
        except BaseException as exc:  # the test asserts on it
            self.error = exc

    def __enter__(self) -> Background:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.consumer.stop()
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "the consumer did not stop"

    def wait(
        self, condition: Callable[[], Any], what: str, *, nudge: Callable[[], None] | None = None
    ) -> None:
        """``wait_for`` that gives up as soon as the consumer's thread has ended."""

        def done() -> Any:
            if not self.thread.is_alive():
                raise AssertionError(f"the consumer ended ({self.error!r}) before {what}")
            return condition()

        wait_for(done, what, nudge=nudge)


def wait_for(
    condition: Callable[[], Any], what: str, *, nudge: Callable[[], None] | None = None
) -> None:
    """Poll *condition* every few milliseconds until it holds (or fail after ``WAIT``)."""
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        if nudge is not None:
            nudge()
        time.sleep(0.005)


def bootstrap(server: Server, store: Any) -> Mapping[str, Any]:
    """Start the stream once with no checkpoint; returns the captured position."""
    burst(stream(server), store)
    return store.find(STREAM).last_seen_token


def seed_events(server: Server, store: Any, *ids: int) -> list[Mapping[str, Any]]:
    """Bootstrap, insert *ids* and consume them once: their resume tokens, in order."""
    bootstrap(server, store)
    server.insert(*ids)
    seen = Seen()
    burst(stream(server, seen), store)
    assert seen.ids == list(ids)
    return seen.tokens


def now() -> datetime:
    return timezone.now()


# -- 1. bootstrap -------------------------------------------------------------------------------


def test_bootstrap_persists_the_servers_position_before_the_first_event(server):
    """No checkpoint: the PBRT of the batchSize-0 aggregate is saved as seen before the main
    cursor opens after it, so an event written in between is not lost."""
    store = RecordingStore(server.wire)
    seen = Seen()
    at_first_event: list[Checkpoint | None] = []

    def handler(doc, ctx):
        if not seen.ids:
            at_first_event.append(store.find(STREAM))
        seen(doc, ctx)

    def insert_after_capture(write: Write) -> None:
        if write.caller == "open_stream":
            server.insert(1)  # after the capture, before the main cursor's aggregate

    store.after_write = insert_after_capture
    spec = stream(server, handler)
    with Background(consumer(spec, store)) as bg:
        bg.wait(lambda: seen.ids == [1], "the event written during the hand-off")
        server.insert(2, 3)
        bg.wait(lambda: seen.ids == [1, 2, 3], "the events written after the start")

    [capture] = server.wire.bootstraps()
    assert capture.command["cursor"] == {"batchSize": 0}
    assert capture.command["pipeline"] == [{"$changeStream": {}}]
    assert capture.reply is not None and capture.batch == []
    pbrt = capture.pbrt
    assert pbrt is not None
    capture_id = capture.reply["cursor"]["id"]
    if capture_id:
        killed = server.wire.commands("killCursors")
        assert any(capture_id in k.command["cursors"] for k in killed), "the capture is closed"

    [saved] = store.of("save_seen")
    assert saved.caller == "open_stream" and saved.args[1] == pbrt
    [main] = server.wire.streams()
    opened_at = next(i for i, sent in enumerate(server.wire.sent) if sent is main)
    assert opened_at >= saved.wire_position, "persisted before the main cursor opened"
    assert main.stage == {"resumeAfter": pbrt}
    assert at_first_event[0] is not None
    assert at_first_event[0].last_seen_token == pbrt
    assert at_first_event[0].last_heartbeat_at is not None
    assert at_first_event[0].last_processed_token is None

    polls = server.wire.polls()
    assert polls, "the main cursor was polled"
    assert all(p.command["maxTimeMS"] == MAX_AWAIT_MS for p in polls)
    assert {s.comment for s in server.wire.commands("aggregate")} == {
        BOOTSTRAP_COMMENT,
        MAIN_COMMENT,
    }
    after = store.find(STREAM)
    assert after.last_processed_token == seen.tokens[-1]
    assert after.last_seen_token == pbrt, "no heartbeat ran: seen is still the capture"


# -- 2. level 1 --------------------------------------------------------------------------------


def test_level1_resumes_after_the_processed_anchor(server):
    """A valid processed anchor: exactly the events after it are delivered, none before."""
    store = RecordingStore(server.wire)
    tokens = seed_events(server, store, 1, 2, 3, 4)
    store.save_processed(STREAM, tokens[1], now())
    server.wire.clear()
    seen = Seen()
    burst(stream(server, seen), store)
    assert seen.ids == [3, 4]
    assert [s.stage for s in server.wire.streams()] == [{"resumeAfter": tokens[1]}]
    assert server.wire.bootstraps() == []
    assert store.find(STREAM).last_processed_token == tokens[3]


def test_latest_ignores_the_saved_anchors(server):
    """start_position=LATEST: no cascade, the cursor opens at "now" with no resume option."""
    store = RecordingStore(server.wire)
    tokens = seed_events(server, store, 1, 2)
    store.save_processed(STREAM, tokens[0], now())
    server.wire.clear()
    seen = Seen()
    burst(stream(server, seen, checkpoint=CheckpointSpec(start_position="LATEST")), store)
    assert seen.ids == [], "event 2, after the saved anchor, is not replayed"
    assert [s.stage for s in server.wire.streams()] == [{}]
    assert server.wire.bootstraps() == []


def test_pipeline_and_full_document_are_on_every_cursor(server):
    """The stream's fullDocument and $match go on the capture and on the main cursor alike;
    filtered-out events never reach the handler."""
    store = RecordingStore(server.wire)
    match = {"$match": {"operationType": "insert", "fullDocument.n": {"$in": [2, 3]}}}
    seen = Seen()
    spec = stream(server, seen, full_document="updateLookup", pipeline=lambda: [match])
    with Background(consumer(spec, store)) as bg:
        bg.wait(lambda: server.wire.polls(), "the first poll")
        server.insert(1, 2, 3)
        bg.wait(lambda: seen.ids == [2, 3], "the matching events")
    expected = [{"$changeStream": {"fullDocument": "updateLookup"}}, match]
    [capture] = server.wire.bootstraps()
    assert capture.command["pipeline"] == expected
    [main] = server.wire.streams()
    assert main.command["pipeline"] == [
        {"$changeStream": {"fullDocument": "updateLookup", "resumeAfter": capture.pbrt}},
        match,
    ]
    assert [e["fullDocument"]["n"] for e in server.wire.delivered("insert")] == [2, 3]


# -- 3. level 2 --------------------------------------------------------------------------------


def test_level2_resumes_after_seen_when_processed_aged_out(scripted, caplog):
    """Scripted lane only (truncates the oplog). Processed has left the history, seen has not:
    the stream resumes after seen, with a warning."""
    store = RecordingStore(scripted.wire)
    tokens = seed_events(scripted, store, 1, 2, 3, 4, 5)
    scripted.lose_history(keep_last=3)  # events 3, 4 and 5 remain
    store.save(
        Checkpoint(
            STREAM,
            last_processed_token=tokens[0],
            last_processed_at=now(),
            last_seen_token=tokens[3],
            last_seen_at=now(),
        )
    )
    scripted.wire.clear()
    seen = Seen()
    with caplog.at_level(logging.WARNING, logger="flowwarden_django.streams"):
        burst(stream(scripted, seen), store)
    assert seen.ids == [5]
    opens = scripted.wire.streams()
    assert [s.stage for s in opens] == [{"resumeAfter": tokens[0]}, {"resumeAfter": tokens[3]}]
    assert opens[0].failure is not None and opens[0].failure["code"] == 286
    assert "aged out" in caplog.text
    after = store.find(STREAM)
    assert after.last_processed_token == tokens[4]
    assert after.last_seen_token == tokens[3]


# -- 4. level 3 ----------------------------------------------------------------------------------


def test_level3_fail_is_terminal_and_leaves_the_checkpoint_alone(scripted):
    """Scripted lane only (truncates the oplog). Both anchors are gone under FAIL."""
    store = RecordingStore(scripted.wire)
    tokens = seed_events(scripted, store, 1, 2, 3)
    store.save_processed(STREAM, tokens[0], now())
    scripted.lose_history(keep_last=1)
    before = store.find(STREAM)
    scripted.wire.clear()
    store.writes.clear()
    seen = Seen()
    running = consumer(stream(scripted, seen), store)
    with pytest.raises(HistoryLostError, match=f"flowwarden_checkpoints reset {STREAM}"):
        running.run(burst=True)
    assert running.state == StreamState.CRASHED and running.restarts == 0
    assert seen.ids == []
    assert store.find(STREAM) == before and store.writes == []
    assert [s.stage for s in scripted.wire.streams()] == [
        {"resumeAfter": tokens[0]},
        {"resumeAfter": before.last_seen_token},
    ]
    assert all(s.failure["code"] == 286 for s in scripted.wire.streams())
    assert scripted.wire.bootstraps() == [], "FAIL captures no fresh position"


def test_level3_resume_from_now_installs_a_fresh_position_through_the_guarded_reset(scripted):
    """Scripted lane only (truncates the oplog). RESUME_FROM_NOW: processed is cleared, a fresh
    seen installed; what was lost stays lost and later events are delivered."""
    store = RecordingStore(scripted.wire)
    tokens = seed_events(scripted, store, 1, 2, 3)
    scripted.lose_history(keep_last=0)
    scripted.wire.clear()
    policy = CheckpointSpec(on_history_lost="RESUME_FROM_NOW")
    seen = Seen()
    with Background(consumer(stream(scripted, seen, checkpoint=policy), store)) as bg:
        bg.wait(
            lambda: scripted.wire.streams()[-1:] and store.of("reset_after_history_lost"),
            "the reset and the reopen",
        )
        scripted.insert(4)
        bg.wait(lambda: seen.ids == [4], "an event after the reset")
    [capture] = scripted.wire.bootstraps()
    fresh = capture.pbrt
    [reset] = store.of("reset_after_history_lost")
    assert reset.args[1:3] == (fresh, tokens[2]), "guarded on the dead processed anchor"
    assert [s.stage for s in scripted.wire.streams()][-1] == {"resumeAfter": fresh}
    after = store.find(STREAM)
    assert after.last_seen_token == fresh and after.last_heartbeat_at is not None
    assert after.last_processed_token == seen.tokens[0]
    assert seen.ids == [4], "nothing before the reset is replayed"


@pytest.mark.parametrize("heartbeat", [300, 0])
def test_level3_resume_from_oplog_start_replays_what_is_left(scripted, heartbeat):
    """Scripted lane only (truncates the oplog). RESUME_FROM_OPLOG_START opens at the oldest
    oplog time read on the wire, replays the retained events, then installs the first
    certified idle position through the guarded reset, keeping the fresh processed anchor.
    The recovery certifies even when the periodic heartbeat is off."""
    store = RecordingStore(scripted.wire)
    tokens = seed_events(scripted, store, 1, 2, 3, 4)
    store.save_processed(STREAM, tokens[0], now())
    oldest = scripted.lose_history(keep_last=2)  # events 3 and 4 remain
    scripted.wire.clear()
    store.writes.clear()
    pbrt_at_reset = []
    store.after_write = lambda w: (
        pbrt_at_reset.append(scripted.wire.last_pbrt())
        if w.method == "reset_after_history_lost"
        else None
    )
    seen = Seen()
    policy = CheckpointSpec(
        on_history_lost="RESUME_FROM_OPLOG_START", idle_heartbeat_interval_seconds=heartbeat
    )
    burst(stream(scripted, seen, checkpoint=policy), store)

    assert seen.ids == [3, 4]
    [oplog_read] = scripted.wire.commands("find")
    assert oplog_read.command["find"] == "oplog.rs" and oplog_read.command["$db"] == "local"
    assert oplog_read.command["sort"] == {"$natural": 1}
    assert scripted.wire.streams()[-1].stage == {"startAtOperationTime": oldest}
    [reset] = store.of("reset_after_history_lost")
    assert reset.caller == "on_idle"
    assert reset.args[1:3] == (pbrt_at_reset[0], tokens[0])
    assert [w.method for w in store.writes] == [
        "save_processed",
        "save_processed",
        "reset_after_history_lost",
    ], "the dead anchors stay until the position is certified"
    after = store.find(STREAM)
    assert after.last_processed_token == seen.tokens[-1], "the fresh anchor survived the reset"
    assert after.last_seen_token == pbrt_at_reset[0]


# -- 5. invalidate -------------------------------------------------------------------------------


def test_drop_under_fail_dispatches_drop_and_writes_the_terminal_marker(server):
    """The drop event reaches on_change, invalidate never does; the invalidate token becomes a
    durable marker (seen, processed cleared) so every later start fails loudly."""
    store = RecordingStore(server.wire)
    bootstrap(server, store)
    server.insert(1)
    server.drop()
    seen = Seen()
    running = consumer(stream(server, seen, on_change=seen.on_change), store)
    with pytest.raises(StreamInvalidatedError, match="dropped"):
        running.run(burst=True)
    assert seen.ids == [1] and seen.operations == ["drop"]
    assert running.state == StreamState.CRASHED and running.restarts == 0
    [invalidate] = server.wire.delivered("invalidate")
    marker = store.find(STREAM)
    assert marker.last_processed_token is None
    assert marker.last_seen_token == invalidate["_id"]
    [reset] = store.of("reset_after_history_lost")
    assert reset.args[1:3] == (invalidate["_id"], seen.tokens[0])

    again = consumer(stream(server, Seen()), store)
    with pytest.raises(HistoryLostError):
        again.run(burst=True)
    assert server.wire.streams()[-1].stage == {"resumeAfter": invalidate["_id"]}
    assert server.wire.streams()[-1].failure["code"] == 260


def test_drop_under_resume_from_now_heals_and_keeps_consuming(server):
    """RESUME_FROM_NOW self-heals after a drop: a fresh position through the guarded reset, a
    managed resubscription, and the inserts that recreate the collection are delivered."""
    store = RecordingStore(server.wire)
    bootstrap(server, store)
    policy = CheckpointSpec(on_history_lost="RESUME_FROM_NOW")
    seen = Seen()
    running = consumer(stream(server, seen, on_change=seen.on_change, checkpoint=policy), store)
    with Background(running) as bg:
        server.insert(1)
        bg.wait(lambda: seen.ids == [1], "the first insert")
        server.drop()
        bg.wait(
            lambda: running.restarts == 1 and running.state == StreamState.RUNNING,
            "the resubscription",
        )
        server.insert(2)
        bg.wait(lambda: seen.ids == [1, 2], "an insert after the drop")
    assert bg.error is None
    assert seen.operations == ["drop"]
    assert running.state == StreamState.STOPPED and running.restarts == 1
    heal = server.wire.bootstraps()[-1]
    [reset] = store.of("reset_after_history_lost")
    assert reset.args[1:3] == (heal.pbrt, seen.tokens[0])
    assert server.wire.streams()[-1].stage == {"resumeAfter": heal.pbrt}
    after = store.find(STREAM)
    assert after.last_seen_token == heal.pbrt
    assert after.last_processed_token == seen.tokens[1]


def test_rename_is_terminal_even_under_a_healing_strategy(server):
    """A rename stops the stream for good, whatever the strategy."""
    store = RecordingStore(server.wire)
    bootstrap(server, store)
    server.rename("orders_renamed")
    seen = Seen()
    policy = CheckpointSpec(on_history_lost="RESUME_FROM_NOW")
    running = consumer(stream(server, seen, on_change=seen.on_change, checkpoint=policy), store)
    with pytest.raises(StreamInvalidatedError, match="renamed"):
        running.run(burst=True)
    assert seen.operations == ["rename"]
    assert running.state == StreamState.CRASHED and running.restarts == 0
    [invalidate] = server.wire.delivered("invalidate")
    assert store.find(STREAM).last_seen_token == invalidate["_id"]
    assert len(server.wire.bootstraps()) == 1, "no fresh position after a rename"


# -- 6. errors on a running cursor -------------------------------------------------------------


def test_pymongo_resumes_resumable_errors_by_itself(scripted):
    """Scripted lane only (injects a labelled getMore error and a dropped connection): pymongo
    resumes after the last token, no event is lost or duplicated, no restart is counted."""
    store = RecordingStore(scripted.wire)
    bootstrap(scripted, store)
    scripted.wire.clear()
    seen = Seen()
    running = consumer(stream(scripted, seen), store)
    with Background(running) as bg:
        bg.wait(lambda: scripted.wire.polls(), "the first poll")
        scripted.srv.fail_next("getMore", 6)
        scripted.insert(1, 2, 3)
        bg.wait(lambda: len(seen.ids) >= 3, "events across the error")
        scripted.srv.hang_up_next("getMore")
        scripted.insert(4, 5, 6)
        bg.wait(lambda: len(seen.ids) >= 6, "events across the hang-up")
    assert bg.error is None
    assert seen.ids == [1, 2, 3, 4, 5, 6]
    assert running.restarts == 0 and running.state == StreamState.STOPPED
    failed = [p for p in scripted.wire.polls() if p.failure is not None]
    assert len(failed) == 2
    assert failed[0].failure["code"] == 6
    assert failed[0].failure["errorLabels"] == ["ResumableChangeStreamError"]
    assert failed[1].failure["errtype"] == "AutoReconnect"
    opens = scripted.wire.streams()
    assert len(opens) == 3, "one open and two resumes by the driver"
    replies = sorted(scripted.wire.streams() + scripted.wire.polls(), key=lambda s: s.at)
    for failure, resume in zip(failed, opens[1:], strict=True):
        before = [s.pbrt for s in replies if s.at < failure.at and s.pbrt is not None]
        assert resume.at > failure.at
        assert resume.stage == {"resumeAfter": before[-1]}, "resumed at the last PBRT"
    assert store.find(STREAM).last_processed_token == seen.tokens[-1]


def test_a_non_resumable_error_restarts_through_the_cascade_with_backoff(scripted):
    """Scripted lane only (injects BadValue on a getMore): pymongo gives up, the consumer's
    managed restart waits for the policy's delay and re-enters the cascade at level 1."""
    store = RecordingStore(scripted.wire)
    bootstrap(scripted, store)
    scripted.insert(1, 2)
    scripted.srv.fail_next("getMore", 2)
    seen = Seen()
    restart = RestartPolicySpec(max_attempts=3, initial_delay="50ms", max_delay="1s")
    running = burst(stream(scripted, seen, restart=restart), store)
    assert seen.ids == [1, 2], "nothing lost, nothing replayed"
    assert running.restarts == 1 and running.state == StreamState.STOPPED
    assert isinstance(running.last_error, OperationFailure) and running.last_error.code == 2
    [failed] = [p for p in scripted.wire.polls() if p.failure is not None]
    opens = scripted.wire.streams()
    assert opens[-1].stage == {"resumeAfter": seen.tokens[-1]}, "level 1 after the restart"
    assert opens[-1].at - failed.at >= 0.05, "the restart waited for the backoff"


@pytest.mark.parametrize("strategy", ["FAIL", "RESUME_FROM_OPLOG_START"])
def test_history_lost_under_a_running_cursor_restarts_into_level_3(scripted, strategy):
    """Scripted lane only (truncates the oplog under an open cursor): the getMore fails with
    286, the managed restart re-enters the cascade, both anchors are gone, and the strategy
    decides."""
    store = RecordingStore(scripted.wire)
    bootstrap(scripted, store)
    scripted.insert(1)
    seen = Seen()

    def handler(doc, ctx):
        seen(doc, ctx)
        if doc["_id"] == 1:  # the cursor stands at event 1 when these happen
            scripted.insert(2, 3)
            scripted.lose_history(keep_last=1)  # event 2 is lost, event 3 remains

    spec = stream(scripted, handler, checkpoint=CheckpointSpec(on_history_lost=strategy))
    running = consumer(spec, store)
    if strategy == "FAIL":
        with pytest.raises(HistoryLostError):
            running.run(burst=True)
        assert running.state == StreamState.CRASHED
        assert seen.ids == [1]
    else:
        running.run(burst=True)
        assert seen.ids == [1, 3]
        assert scripted.wire.streams()[-1].stage == {
            "startAtOperationTime": scripted.srv.oldest_retained
        }
        assert store.find(STREAM).last_processed_token == seen.tokens[-1]
    assert running.restarts == 1
    [failed] = [p for p in scripted.wire.polls() if p.failure is not None]
    assert failed.failure["code"] == 286
    assert failed.failure["errorLabels"] == ["NonResumableChangeStreamError"]


# -- 7. the idle heartbeat -----------------------------------------------------------------------


def test_idle_heartbeat_writes_the_servers_advancing_pbrt_as_seen(server):
    """An idle stream certifies its position: seen becomes the PBRT of the latest empty poll
    (newer than the bootstrap's, and past the events handled meanwhile), the heartbeat
    moves, and nothing but the bootstrap and the heartbeat ever writes seen."""
    store = RecordingStore(server.wire)
    pbrt_at_write: list[Mapping[str, Any] | None] = []
    store.after_write = lambda w: (
        pbrt_at_write.append(server.wire.last_pbrt()) if w.caller == "on_idle" else None
    )

    def heartbeats() -> list[Write]:
        return [w for w in store.writes if w.caller == "on_idle"]

    policy = CheckpointSpec(idle_heartbeat_interval_seconds=0.2, save_interval_seconds=0)
    seen = Seen()
    with Background(consumer(stream(server, seen, checkpoint=policy), store)) as bg:
        bg.wait(
            lambda: any(w.method == "save_seen" for w in heartbeats()),
            "a certified position",
            nudge=server.nudge,
        )
        server.insert(1, 2)
        bg.wait(lambda: seen.ids == [1, 2], "two events")
        before_events = len(heartbeats())
        bg.wait(
            lambda: len(heartbeats()) >= before_events + 2,
            "two more heartbeats after the events",
            nudge=server.nudge,
        )

    [capture] = server.wire.bootstraps()
    seen_writes = store.of("save_seen")
    assert seen_writes[0].caller == "open_stream" and seen_writes[0].args[1] == capture.pbrt
    assert {w.caller for w in seen_writes[1:]} == {"on_idle"}, "only the heartbeat writes seen"
    assert store.of("reset_after_history_lost") == []
    assert [w.args[1] for w in store.of("save_processed")] == seen.tokens
    assert not any(w.args[1] in seen.tokens for w in seen_writes), "no event token is seen"
    for write, pbrt in zip(heartbeats(), pbrt_at_write, strict=True):
        if write.method == "save_seen":
            assert write.args[1] == pbrt, "seen is the PBRT of the poll that came back empty"
    stamps = [w.args[-1] for w in heartbeats()]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps), "the heartbeat moves"
    after = store.find(STREAM)
    assert after.last_seen_token == [w.args[1] for w in seen_writes][-1]
    assert after.last_seen_token["_data"] > capture.pbrt["_data"], "newer than the bootstrap"
    assert after.last_seen_token["_data"] > seen.tokens[-1]["_data"], "past the events"
    assert after.last_heartbeat_at == stamps[-1]
    assert after.last_processed_token == seen.tokens[-1]


# -- 8. graceful stop ----------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["stop", "burst"])
def test_graceful_stop_flushes_the_dirty_processed_anchor(server, how):
    """save_every_n=100 and no age threshold: seven settled events stay dirty until the stop,
    whose flush writes the seventh event's token, once."""
    store = RecordingStore(server.wire)
    bootstrap(server, store)
    seen = Seen()
    policy = CheckpointSpec(save_every_n=100, save_interval_seconds=0)
    running = consumer(stream(server, seen, checkpoint=policy), store)
    if how == "stop":
        with Background(running) as bg:
            server.insert(1, 2, 3, 4, 5, 6, 7)
            bg.wait(lambda: len(seen.ids) == 7, "seven events")
            assert store.find(STREAM).last_processed_token is None, "dirty until the stop"
            stopper = threading.Thread(target=running.stop)
            stopper.start()
            stopper.join()
    else:
        server.insert(1, 2, 3, 4, 5, 6, 7)
        running.run(burst=True)
    assert seen.ids == [1, 2, 3, 4, 5, 6, 7]
    assert running.state == StreamState.STOPPED
    [flush] = store.of("save_processed")
    assert flush.args[1] == seen.tokens[6]
    assert store.find(STREAM).last_processed_token == seen.tokens[6]


# -- 9. transactional handlers -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_transactional_handler_and_anchor_commit_together(server):
    """The handler's rows and the processed anchor commit in one transaction (ORM store on the
    default database): a handler that raises after writing leaves neither, and the
    redelivery writes its row once."""
    from flowwarden_django.streams.backends.orm import OrmCheckpointStore
    from tests.testapp.models import Effect

    store = OrmCheckpointStore()
    bootstrap(server, store)
    server.insert(1, 2, 3)
    attempts: Counter[int] = Counter()
    tokens: dict[int, Mapping[str, Any]] = {}
    at_redelivery = []

    def handler(doc, ctx):
        n = doc["_id"]
        attempts[n] += 1
        if attempts[n] == 2:
            rows = Effect.objects.filter(order_id=n).count()
            at_redelivery.append((rows, store.find(STREAM).last_processed_token))
        Effect.objects.create(order_id=n, stream=STREAM)
        tokens[n] = ctx.resume_token
        if n == 2 and attempts[n] == 1:
            raise RuntimeError("the handler fails after its write")

    running = burst(stream(server, handler, transactional=True), store)
    assert sorted(Effect.objects.values_list("order_id", flat=True)) == [1, 2, 3]
    assert attempts == {1: 1, 2: 2, 3: 1}
    assert at_redelivery == [(0, tokens[1])], "no row and no anchor for the failed attempt"
    assert running.restarts == 1
    assert server.wire.streams()[-1].stage == {"resumeAfter": tokens[1]}
    assert store.find(STREAM).last_processed_token == tokens[3]


@pytest.mark.django_db(transaction=True)
def test_transactional_anchor_write_failure_rolls_back_and_redelivers(server):
    """The anchor write itself fails inside the handler's transaction: the handler's row rolls
    back with it, the stop does not persist that anchor outside the transaction, and the
    redelivery writes the row once."""
    from flowwarden_django.streams.backends.orm import OrmCheckpointStore
    from tests.testapp.models import Effect

    class FailsOnce(OrmCheckpointStore):
        calls = 0

        def save_processed(
            self, stream_name: str, token: Token | None, at: Any, heartbeat_at: Any = None
        ) -> None:
            FailsOnce.calls += 1
            if FailsOnce.calls == 2:
                raise DatabaseError("the anchor write failed")
            super().save_processed(stream_name, token, at, heartbeat_at)

    store = FailsOnce()
    bootstrap(server, store)
    server.insert(1, 2, 3)
    tokens: dict[int, Mapping[str, Any]] = {}

    def handler(doc, ctx):
        Effect.objects.create(order_id=doc["_id"], stream=STREAM)
        tokens[doc["_id"]] = ctx.resume_token

    running = burst(stream(server, handler, transactional=True), store)
    assert sorted(Effect.objects.values_list("order_id", flat=True)) == [1, 2, 3]
    assert running.restarts == 1
    assert server.wire.streams()[-1].stage == {"resumeAfter": tokens[1]}
    assert store.find(STREAM).last_processed_token == tokens[3]


# -- live lane only ------------------------------------------------------------------------------


@on_lane("mongo_live")
def test_live_oplog_boundary_and_history_lost_code(live):
    """Lane (c) only: the premises RESUME_FROM_OPLOG_START and the fake rest on. The oplog's
    first entry is readable through the stream's client, and a stream opened before it fails
    with a history-lost code."""
    source = pymongo_source(stream(live))
    oldest = source.oldest_oplog_time()
    assert oldest is not None, "local.oplog.rs is readable with this URL's credentials"
    from bson import Timestamp

    with pytest.raises(OperationFailure) as info:
        cursor = source.open(start_at_operation_time=Timestamp(max(oldest.time - 3600, 1), 1))
        try:
            cursor.try_next()
        finally:
            cursor.close()
    assert is_history_lost(info.value), info.value.details


# -- 8. the dead-letter queue ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_poison_event_is_parked_after_its_retries_and_settles_when_replayed(server):
    """The poison event is tried three times, parked in the ORM DLQ (with the anchor, in one
    transaction), the stream goes on; after the handler is fixed, replaying the entry runs it
    through the stream's handler once and marks it REPLAYED."""
    from flowwarden_django.streams.backends.orm import OrmCheckpointStore, OrmDlqStore
    from flowwarden_django.streams.operations.replay import replay_dead_letter
    from flowwarden_django.streams.registry import stream_registry
    from flowwarden_django.streams.spec import DeadLetterQueueSpec, RetryPolicySpec
    from tests.testapp.models import Effect

    store, dlq = OrmCheckpointStore(), OrmDlqStore()
    bootstrap(server, store)
    server.insert(1, 2, 3)
    fixed = threading.Event()
    attempts: Counter[int] = Counter()
    tokens: dict[int, Mapping[str, Any]] = {}

    def handler(doc, ctx):
        n = doc["_id"]
        attempts[n] += 1
        tokens[n] = ctx.resume_token
        Effect.objects.create(order_id=n, stream=STREAM)
        if n == 2 and not fixed.is_set():
            raise RuntimeError("order 2 is poison")

    spec = stream(
        server,
        handler,
        transactional=True,
        retry_policy=RetryPolicySpec(max_attempts=3, initial_delay="5ms", jitter=False),
        dead_letter_queue=DeadLetterQueueSpec(retention_days=7),
    )
    stream_registry.add_spec(spec)
    try:
        running = burst(spec, store)
        assert attempts == {1: 1, 2: 3, 3: 1} and running.restarts == 0
        assert sorted(Effect.objects.values_list("order_id", flat=True)) == [1, 3]
        assert store.find(STREAM).last_processed_token == tokens[3]
        (entry,) = dlq.find_by_stream(STREAM)
        assert (entry.status, entry.attempts, entry.operation_type) == ("PENDING", 3, "insert")
        assert entry.error.message == "order 2 is poison" and "Traceback" in entry.error.stack_trace
        assert entry.full_document == {"_id": 2, "n": 2} and entry.resume_token == tokens[2]
        assert dlq.count(STREAM) == 1

        fixed.set()  # the handler is fixed and deployed
        outcome = replay_dead_letter(entry.id, by="operator")
        assert outcome.succeeded and outcome.status == "REPLAYED"
        assert sorted(Effect.objects.values_list("order_id", flat=True)) == [1, 2, 3]
        replayed = dlq.find_by_id(entry.id)
        assert replayed.status == "REPLAYED" and replayed.replay_count == 1
        assert replayed.resolved_by == "operator" and dlq.count(STREAM) == 0
        assert not replay_dead_letter(entry.id).succeeded  # settled: a second replay is refused
        assert Effect.objects.filter(order_id=2).count() == 1
    finally:
        stream_registry.unregister(STREAM)
