"""The consumer core without I/O: each decision is fed the results a driver would send
back (or the errors it would throw in), and the effects it asks for are checked in
order. No server, no database, no thread, no event loop: this is where the resume
cascade, the history-lost strategies and the heartbeat are tested as a table, and
both runtimes run exactly this code (``tests/streams/test_runtime.py`` and
``test_async_runtime.py`` drive it for real).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from flowwarden_django.common.failure_log import FailureLog
from flowwarden_django.streams.checkpoint import Checkpoint
from flowwarden_django.streams.core.driving import adrive, drive
from flowwarden_django.streams.core.effects import (
    CancelAnchors,
    CloseCursor,
    CopyCollection,
    DiscardUnusableConnections,
    FindCheckpoint,
    FlushAnchorIfDue,
    HandleEvent,
    Idle,
    InitialPosition,
    OldestOplogTime,
    OpenCursor,
    PauseBeforeRestart,
    PollCursor,
    ResetAfterHistoryLost,
    RunGeneration,
    SaveHeartbeat,
    SaveSeen,
)
from flowwarden_django.streams.core.generation import consume
from flowwarden_django.streams.core.heartbeat import Heartbeat
from flowwarden_django.streams.core.lifecycle import (
    RestartNow,
    StreamInvalidatedError,
    StreamState,
    restart_delay,
    supervise,
)
from flowwarden_django.streams.core.resume import (
    MAX_COPIES_PER_OPEN,
    HistoryLostError,
    Opened,
    OplogTooShortError,
    open_arguments,
    open_stream,
)
from flowwarden_django.streams.initial_sync import CopyInterrupted, InitialSyncConflictError
from flowwarden_django.streams.locks import LeaseLostError
from flowwarden_django.streams.spec import CheckpointSpec, StreamSpec

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PROCESSED, SEEN, NOW = {"_data": "processed"}, {"_data": "seen"}, {"_data": "now"}
EVENT = {"_id": {"_data": "e1"}, "operationType": "insert"}


class Lost(Exception):
    """What the server says of a position that left its history."""

    code = 286


class Cursor:
    """A stand-in cursor: only its identity matters to the core."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<cursor {self.name}>"


def spec(**checkpoint: Any) -> StreamSpec:
    return StreamSpec(name="orders", collection="orders", checkpoint=CheckpointSpec(**checkpoint))


def saved(processed: Any = PROCESSED, seen: Any = SEEN, **fields: Any) -> Checkpoint:
    return Checkpoint(
        "orders",
        last_processed_token=processed,
        last_processed_at=T0 if processed else None,
        last_seen_token=seen,
        last_seen_at=T0 if seen else None,
        **fields,
    )


class Script:
    """Answers the effects of one decision, in order: each entry is a predicate of
    the effect (or the effect's type) and the result to send back (an exception is
    thrown in). Records every effect; fails on one it did not expect."""

    def __init__(self, *steps: tuple[Any, Any]) -> None:
        self.steps = list(steps)
        self.seen: list[Any] = []

    def __call__(self, effect: Any) -> Any:
        self.seen.append(effect)
        assert self.steps, f"an effect the script did not expect: {effect!r}"
        expected, result = self.steps.pop(0)
        matches = (
            expected(effect)
            if callable(expected) and not isinstance(expected, type)
            else (isinstance(effect, expected))
        )
        assert matches, f"expected {expected!r}, the core asked for {effect!r}"
        if isinstance(result, BaseException):
            raise result
        return result

    def done(self) -> None:
        assert not self.steps, f"effects the core never asked for: {self.steps!r}"


def open_at(token: Any) -> Callable[[Any], bool]:
    return lambda e: isinstance(e, OpenCursor) and e.resume_after == token


def run(decision: Any, script: Script) -> Any:
    outcome = drive(decision, script)
    script.done()
    return outcome


# -- the resume cascade -------------------------------------------------------------------


def test_latest_opens_at_the_servers_position_and_reads_nothing() -> None:
    cursor = Cursor("latest")
    opened = run(open_stream(spec(start_position="LATEST")), Script((OpenCursor, cursor)))
    assert opened.cursor is cursor and opened.certified is None


def test_a_first_start_makes_the_servers_position_durable_before_opening() -> None:
    cursor = Cursor("first")
    script = Script(
        (FindCheckpoint, None),
        (InitialPosition, NOW),
        (lambda e: isinstance(e, SaveSeen) and e.position == NOW, None),
        (open_at(NOW), cursor),
    )
    opened = run(open_stream(spec()), script)
    assert (opened.cursor, opened.certified, opened.first_event) == (cursor, NOW, None)


@pytest.mark.parametrize(
    ("name", "steps", "cursor", "certified", "confirmed"),
    [
        (
            "the processed anchor",
            [(open_at(PROCESSED), "p"), (PollCursor, EVENT)],
            "p",
            None,
            PROCESSED,
        ),
        (
            "processed lost when opening: the seen anchor",
            [(open_at(PROCESSED), Lost()), (open_at(SEEN), "s"), (PollCursor, None)],
            "s",
            SEEN,
            None,
        ),
        (
            "processed lost at the first poll: closed, then the seen anchor",
            [
                (open_at(PROCESSED), "p"),
                (PollCursor, Lost()),
                (CloseCursor, None),
                (open_at(SEEN), "s"),
                (PollCursor, None),
            ],
            "s",
            SEEN,
            None,
        ),
    ],
)
def test_the_cascade_prefers_processed_then_seen(
    name: str, steps: list[Any], cursor: str, certified: Any, confirmed: Any
) -> None:
    opened = run(open_stream(spec()), Script((FindCheckpoint, saved()), *steps))
    assert (opened.cursor, opened.certified, opened.confirmed_processed) == (
        cursor,
        certified,
        confirmed,
    ), name


def test_equal_anchors_are_tried_once() -> None:
    script = Script((FindCheckpoint, saved(seen=PROCESSED)), (open_at(PROCESSED), Lost()))
    with pytest.raises(HistoryLostError, match="flowwarden_checkpoints reset orders"):
        run(open_stream(spec(on_history_lost="FAIL")), script)


def test_an_error_that_is_not_history_lost_propagates_after_closing_the_cursor() -> None:
    script = Script(
        (FindCheckpoint, saved()),
        (open_at(PROCESSED), "p"),
        (PollCursor, ConnectionError("reset by peer")),
        (CloseCursor, None),
    )
    with pytest.raises(ConnectionError, match="reset by peer"):
        run(open_stream(spec()), script)


BOTH_LOST = [(FindCheckpoint, saved()), (open_at(PROCESSED), Lost()), (open_at(SEEN), Lost())]


def test_history_lost_under_fail_names_the_last_known_time() -> None:
    with pytest.raises(HistoryLostError) as raised:
        run(open_stream(spec(on_history_lost="FAIL")), Script(*BOTH_LOST))
    assert raised.value.last_known == T0


def test_resume_from_now_replaces_the_dead_anchor_through_the_guarded_reset() -> None:
    script = Script(
        *BOTH_LOST,
        (InitialPosition, NOW),
        (
            lambda e: (
                isinstance(e, ResetAfterHistoryLost)
                and (e.position, e.expected) == (NOW, PROCESSED)
            ),
            None,
        ),
        (open_at(NOW), "now"),
    )
    opened = run(open_stream(spec(on_history_lost="RESUME_FROM_NOW")), script)
    assert (opened.cursor, opened.certified) == ("now", NOW)


def test_resume_from_oplog_start_replays_and_keeps_the_dead_anchor_as_the_marker() -> None:
    script = Script(
        *BOTH_LOST,
        (OldestOplogTime, "t-oldest"),
        (lambda e: isinstance(e, OpenCursor) and e.start_at_operation_time == "t-oldest", "old"),
    )
    opened = run(open_stream(spec(on_history_lost="RESUME_FROM_OPLOG_START")), script)
    assert (opened.cursor, opened.certified, opened.recovery_expected) == (
        "old",
        None,
        (PROCESSED,),
    )


def test_resume_from_oplog_start_without_an_oldest_time_resumes_from_now() -> None:
    script = Script(
        *BOTH_LOST,
        (OldestOplogTime, None),
        (InitialPosition, NOW),
        (ResetAfterHistoryLost, None),
        (open_at(NOW), "now"),
    )
    assert (
        run(open_stream(spec(on_history_lost="RESUME_FROM_OPLOG_START")), script).certified == NOW
    )


def test_resync_copies_then_streams_from_the_captured_position() -> None:
    script = Script(
        *BOTH_LOST,
        (lambda e: isinstance(e, CopyCollection) and e.reason == "history lost", "captured"),
        (open_at("captured"), "c"),
        (PollCursor, None),
    )
    opened = run(open_stream(spec(on_history_lost="RESYNC")), script)
    assert (opened.cursor, opened.certified) == ("c", "captured")


def test_resync_stops_after_copies_that_each_outlast_the_oplog() -> None:
    steps = []
    for copy in range(MAX_COPIES_PER_OPEN):
        steps += [
            (CopyCollection, f"captured-{copy}"),
            (open_at(f"captured-{copy}"), Lost()),
            (FindCheckpoint, saved()),
        ]
    script = Script(*BOTH_LOST, *steps)
    with pytest.raises(OplogTooShortError, match=f"{MAX_COPIES_PER_OPEN} copies in a row"):
        run(open_stream(spec(on_history_lost="RESYNC")), script)


def test_copy_existing_copies_on_its_first_start_and_a_copy_in_progress_continues() -> None:
    first = Script(
        (FindCheckpoint, None),
        (lambda e: isinstance(e, CopyCollection) and e.reason == "first start", "cap"),
        (open_at("cap"), "c"),
        (PollCursor, None),
    )
    assert run(open_stream(spec(start_position="COPY_EXISTING")), first).certified == "cap"
    copying = saved(initial_sync={"phase": "copying", "reason": "on demand", "batch": 2})
    again = Script(
        (FindCheckpoint, copying),
        (lambda e: isinstance(e, CopyCollection) and e.reason == "on demand", "cap2"),
        (open_at("cap2"), "c2"),
        (PollCursor, None),
    )
    assert run(open_stream(spec()), again).cursor == "c2"


def test_open_arguments_name_only_what_the_effect_sets() -> None:
    assert open_arguments(OpenCursor()) == {}
    assert open_arguments(OpenCursor(resume_after=NOW)) == {"resume_after": NOW}
    assert open_arguments(OpenCursor(start_at_operation_time=5)) == {"start_at_operation_time": 5}


def test_the_async_driver_runs_the_same_decision() -> None:
    async def perform(effect: Any) -> Any:
        return script(effect)

    script = Script((FindCheckpoint, saved()), (open_at(PROCESSED), "p"), (PollCursor, None))
    opened = asyncio.run(adrive(open_stream(spec()), perform))
    script.done()
    assert isinstance(opened, Opened) and opened.confirmed_processed == PROCESSED


# -- the idle heartbeat --------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Failures:
    def __init__(self) -> None:
        self.log: list[str] = []

    def failed(self, exc: BaseException) -> None:
        self.log.append(f"failed {exc}")

    def succeeded(self) -> None:
        self.log.append("ok")


def heartbeat(clock: Clock, interval: float = 10, **options: Any) -> tuple[Heartbeat, Failures]:
    failures = Failures()
    return Heartbeat("orders", interval, clock, failures, **options), failures


def test_the_heartbeat_writes_once_per_interval_of_idleness() -> None:
    clock = Clock()
    beat, failures = heartbeat(clock, certified=SEEN)
    run(beat.on_idle(NOW), Script())  # not idle long enough
    clock.now += 10
    run(beat.on_idle(NOW), Script((lambda e: isinstance(e, SaveSeen) and e.position == NOW, None)))
    run(beat.on_idle(NOW), Script())  # just written
    clock.now += 10
    run(beat.on_idle(NOW), Script((SaveHeartbeat, None)))  # same position: the heartbeat alone
    beat.last_activity = clock.now  # an event was handled
    clock.now += 5
    run(beat.on_idle(NOW), Script())
    assert (beat.writes, beat.certified, failures.log) == (2, NOW, ["ok", "ok"])


def test_the_heartbeat_needs_a_server_certified_position_and_an_interval() -> None:
    clock = Clock()
    beat, _ = heartbeat(clock)
    clock.now += 60
    run(beat.on_idle(None), Script())
    off, _ = heartbeat(clock, interval=0)
    clock.now += 60
    run(off.on_idle(NOW), Script())


def test_after_an_oplog_start_replay_the_first_certification_is_the_guarded_reset() -> None:
    clock = Clock()
    beat, _ = heartbeat(clock, interval=0, recovery_expected=(PROCESSED,))
    reset = Script(
        (
            lambda e: (
                isinstance(e, ResetAfterHistoryLost)
                and (e.position, e.expected) == (NOW, PROCESSED)
            ),
            None,
        )
    )
    run(beat.on_idle(NOW), reset)  # at once, though the periodic heartbeat is off
    clock.now += 60
    run(beat.on_idle(NOW), Script())
    assert beat.recovery_expected is None and beat.certified == NOW


def test_a_failed_heartbeat_write_is_logged_and_the_connections_discarded() -> None:
    clock = Clock()
    beat, failures = heartbeat(clock)
    clock.now += 10
    script = Script((SaveSeen, ConnectionError("db down")), (DiscardUnusableConnections, None))
    run(beat.on_idle(NOW), script)
    assert (beat.writes, beat.failures, beat.certified) == (0, 1, None)
    assert failures.log == ["failed db down"]
    run(beat.on_idle(NOW), Script((SaveSeen, None)))  # tried again at the next idle poll
    assert failures.log[-1] == "ok" and beat.certified == NOW


def test_the_core_imports_no_thread_loop_or_driver() -> None:
    """What makes it a core: no threads, no event loop, no driver or database module
    (the import contract ``consumer-core`` checks the project's own modules)."""
    import ast
    from pathlib import Path

    import flowwarden_django.streams.core as core

    # It may read the clock (time.perf_counter for the metrics), never wait on it.
    banned = {"asyncio", "threading", "pymongo", "django.db", "asgiref"}
    for path in Path(core.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {
            name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for name in (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            )
            if name
        }
        assert not {n for n in imported if n.split(".")[0] in banned or n in banned}, path.name
        waits = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in ("sleep", "wait")
        ]
        assert not waits, path.name


# -- a consumer's life: the restart loop ------------------------------------------------


class Record:
    """What a driver keeps of a consumer, as the core reads and writes it."""

    def __init__(self, spec_: StreamSpec, *, stop_after: int | None = None) -> None:
        self.spec = spec_
        self.state = None
        self.events_handled = self.documents_copied = self.restarts = self.heartbeats = 0
        self.last_error: BaseException | None = None
        self.restarting_since = self.restart_error = self.restart_cause = None
        self.started_at = self.last_event_stamp = None
        self.stop_after = stop_after  # events after which a stop is asked for
        self.lease_lost = False

    @property
    def stopping(self) -> bool:
        return self.stop_after is not None and self.events_handled >= self.stop_after

    @property
    def counts(self) -> Record:
        return self  # where the core adds to events_handled

    def check_lease(self) -> None:
        if self.lease_lost:
            raise LeaseLostError("lost")


def restart_spec(max_attempts: int) -> StreamSpec:
    from flowwarden_django.streams.spec import RestartPolicySpec

    policy = RestartPolicySpec(max_attempts=max_attempts, initial_delay=0.1, jitter=False)
    return StreamSpec(name="orders", collection="orders", restart_policy=policy)


@pytest.mark.parametrize(
    ("ending", "raises", "state"),
    [
        (None, None, StreamState.STOPPED),  # a generation that returns: a graceful stop
        (CopyInterrupted(), None, StreamState.STOPPED),
        (LeaseLostError("taken"), None, StreamState.STOPPED),
        (HistoryLostError("orders", None), HistoryLostError, StreamState.CRASHED),
        (StreamInvalidatedError("renamed"), StreamInvalidatedError, StreamState.CRASHED),
        (InitialSyncConflictError("two copies"), InitialSyncConflictError, StreamState.CRASHED),
    ],
)
def test_how_a_generation_ends_decides_the_streams_state(ending, raises, state) -> None:
    record = Record(restart_spec(3))
    script = Script((RunGeneration, ending))
    if raises is None:
        run(supervise(record, burst=False), script)
    else:
        with pytest.raises(raises):
            run(supervise(record, burst=False), script)
    assert record.state is state
    assert record.restarts == 0


def test_failed_generations_restart_with_backoff_until_the_attempts_run_out() -> None:
    record = Record(restart_spec(2))
    boom = ConnectionError("cursor died")
    script = Script(
        (RunGeneration, boom),
        (DiscardUnusableConnections, None),
        (lambda e: isinstance(e, PauseBeforeRestart) and e.seconds == pytest.approx(0.1), False),
        (RunGeneration, boom),
        (DiscardUnusableConnections, None),
        (lambda e: isinstance(e, PauseBeforeRestart) and e.seconds == pytest.approx(0.2), False),
        (RunGeneration, boom),
    )
    with pytest.raises(ConnectionError):
        run(supervise(record, burst=False), script)
    assert (record.state, record.restarts, record.last_error) == (StreamState.CRASHED, 2, boom)
    assert record.restart_cause == (2, boom)


def test_a_generation_that_made_progress_resets_the_attempts() -> None:
    record = Record(restart_spec(1))

    def progressed_then_died(effect: Any) -> bool:
        record.events_handled += 1  # the generation handled an event before it died
        return isinstance(effect, RunGeneration)

    boom = ConnectionError("cursor died")
    script = Script(
        (progressed_then_died, boom),
        (DiscardUnusableConnections, None),
        (PauseBeforeRestart, False),
        (progressed_then_died, boom),
        (DiscardUnusableConnections, None),
        (PauseBeforeRestart, True),  # a stop during the wait
    )
    run(supervise(record, burst=False), script)
    assert (record.state, record.restarts) == (StreamState.STOPPED, 2)


def test_an_outage_restarts_within_two_seconds_whatever_the_policy() -> None:
    from flowwarden_django.streams.spec import RestartPolicySpec

    slow = RestartPolicySpec(initial_delay=60, jitter=False)
    outage = ConnectionRefusedError(111, "Connection refused")
    assert restart_delay(StreamSpec("s", "c", restart_policy=slow), 1) == 60
    assert restart_delay(StreamSpec("s", "c", restart_policy=slow), 1, outage) == 2.0


def test_a_restart_now_resubscribes_without_a_pause() -> None:
    record = Record(restart_spec(1))
    run(supervise(record, burst=True), Script((RunGeneration, RestartNow()), (RunGeneration, None)))
    assert (record.state, record.restarts) == (StreamState.STOPPED, 1)


# -- one generation: poll, handle, idle ----------------------------------------------------


class LiveCursor(Cursor):
    alive = True
    resume_token = NOW


def generation(record: Record, first_event: Any = None, **checkpoint: Any) -> Any:
    record.spec = spec(**checkpoint)
    opened = Opened(LiveCursor("c"), first_event=first_event, certified=NOW)
    heartbeat = Heartbeat.of_generation(record.spec, opened, lambda: 0.0, FailureLog(None, ""))
    return consume(record, opened, heartbeat, burst=True)


def test_a_generation_handles_each_event_then_idles_once_in_burst() -> None:
    record = Record(spec())
    second = {**EVENT, "_id": {"_data": "e2"}}
    script = Script(
        (lambda e: isinstance(e, HandleEvent) and e.event is EVENT, True),
        (FlushAnchorIfDue, False),
        (PollCursor, second),
        (lambda e: isinstance(e, HandleEvent) and e.operation == "insert", False),  # parked
        (FlushAnchorIfDue, False),
        (PollCursor, None),
        (FlushAnchorIfDue, False),
        (Idle, None),
    )
    run(generation(record, EVENT, idle_heartbeat_interval_seconds=0), script)
    assert record.events_handled == 2 and record.state is StreamState.RUNNING


def test_an_unsettled_event_ends_the_generation_unless_a_stop_asked_for_it() -> None:
    record = Record(spec())
    with pytest.raises(ConnectionError, match="unsettled"):
        run(generation(record, EVENT), Script((HandleEvent, None)))
    record = Record(spec(), stop_after=0)
    run(generation(record, EVENT), Script())  # stopping before the first event
    assert record.events_handled == 0


def test_a_lost_lease_stops_before_the_next_event() -> None:
    record = Record(spec())
    record.lease_lost = True
    with pytest.raises(LeaseLostError):
        run(generation(record, EVENT), Script())


def test_an_age_threshold_of_zero_asks_for_no_flush_per_event() -> None:
    record = Record(spec())
    script = Script(
        (HandleEvent, True), (PollCursor, None), (FlushAnchorIfDue, False), (Idle, None)
    )
    run(
        generation(record, EVENT, save_interval_seconds=0, idle_heartbeat_interval_seconds=0),
        script,
    )


@pytest.mark.parametrize(
    ("before", "on_history_lost", "repair", "outcome", "reset_to"),
    [
        ("drop", "RESUME_FROM_NOW", NOW, RestartNow, NOW),
        ("drop", "FAIL", None, StreamInvalidatedError, EVENT["_id"]),
        ("rename", "RESUME_FROM_NOW", None, StreamInvalidatedError, EVENT["_id"]),
        ("drop", "RESUME_FROM_NOW", Lost("no answer"), StreamInvalidatedError, EVENT["_id"]),
    ],
)
def test_an_invalidate_restarts_from_now_or_stops_for_good(
    before, on_history_lost, repair, outcome, reset_to
) -> None:
    record = Record(spec())
    drop = {"_id": {"_data": "d"}, "operationType": before}
    invalidate = {**EVENT, "operationType": "invalidate"}
    steps: list[tuple[Any, Any]] = [
        (HandleEvent, True),
        (FlushAnchorIfDue, False),
        (PollCursor, invalidate),
        (CancelAnchors, None),
        (FindCheckpoint, saved()),
    ]
    if repair is not None:
        steps.append((InitialPosition, repair))
    if repair is NOW:
        steps.append((lambda e: e == ResetAfterHistoryLost(NOW, PROCESSED, e.at), None))
    else:
        steps.append((lambda e: e.position == reset_to and e.expected == PROCESSED, None))
    record.spec = spec(on_history_lost=on_history_lost)
    opened = Opened(LiveCursor("c"), first_event=drop, certified=NOW)
    heartbeat = Heartbeat.of_generation(record.spec, opened, lambda: 0.0, FailureLog(None, ""))
    with pytest.raises(outcome):
        run(consume(record, opened, heartbeat, burst=True), Script(*steps))


# -- the processed anchor's ledger ---------------------------------------------------------


def ledger(**options: Any) -> Any:
    from flowwarden_django.streams.core.anchors import AnchorLedger

    clock = {"now": 0.0}
    options = {"save_every_n": 3, "save_interval_seconds": 5, "confirmed_token": None} | options
    book = AnchorLedger("orders", monotonic=lambda: clock["now"], failure_log=Quiet(), **options)
    return book, clock


class Quiet:
    def failed(self, exc: Exception) -> None: ...
    def succeeded(self) -> None: ...


def test_the_ledger_asks_for_a_write_at_the_nth_settled_event_or_at_once_when_strict() -> None:
    book, _ = ledger()
    assert [book._settled({"n": i}, T0, False) for i in range(3)] == [False, False, True]
    assert book._settled({"n": 9}, T0, True)


def test_settling_the_confirmed_token_again_leaves_nothing_owed() -> None:
    book, _ = ledger(confirmed_token=PROCESSED)
    assert not book._settled(PROCESSED, T0, False)
    assert not book.dirty


def test_a_dirty_anchor_ages_into_a_write_and_a_failed_write_pauses_the_next() -> None:
    book, clock = ledger()
    book._settled({"n": 1}, T0, False)
    assert not book._aged()
    clock["now"] = 5.0
    assert book._aged()
    written = book._to_write(force=False)
    book._write_failed(RuntimeError("down"), strict=False)
    assert book.dirty and book._to_write(force=False) is None  # pausing
    assert book._to_write(force=True) is written  # a flush on stop still tries
    clock["now"] = 5.0 + book.retry_pause_seconds
    book._written(book._to_write(force=False))
    assert (book.dirty, book.confirmed_token, book.writes, book.failures) == (False, {"n": 1}, 1, 1)


def test_an_event_settled_during_a_write_keeps_the_anchor_dirty() -> None:
    book, _ = ledger()
    book._settled({"n": 1}, T0, False)
    in_flight = book._to_write(force=True)
    book._settled({"n": 2}, T0, False)
    book._written(in_flight)
    assert book.dirty and book.confirmed_token == {"n": 1}


def test_a_strict_write_that_fails_forgets_the_anchor_of_the_rolled_back_event() -> None:
    book, _ = ledger()
    book._settled({"n": 1}, T0, True)
    book._write_failed(RuntimeError("rolled back"), strict=True)
    assert not book.dirty


def test_a_cancelled_ledger_writes_nothing_more() -> None:
    book, _ = ledger()
    book._settled({"n": 1}, T0, False)
    book._cancel()
    assert book._to_write(force=True) is None and not book.dirty
