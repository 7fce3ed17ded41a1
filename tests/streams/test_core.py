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

from flowwarden_django.streams.checkpoint import Checkpoint
from flowwarden_django.streams.core.driving import adrive, drive
from flowwarden_django.streams.core.effects import (
    CloseCursor,
    CopyCollection,
    DiscardUnusableConnections,
    FindCheckpoint,
    InitialPosition,
    OldestOplogTime,
    OpenCursor,
    PollCursor,
    ResetAfterHistoryLost,
    SaveHeartbeat,
    SaveSeen,
)
from flowwarden_django.streams.core.heartbeat import Heartbeat
from flowwarden_django.streams.core.resume import (
    MAX_COPIES_PER_OPEN,
    HistoryLostError,
    Opened,
    OplogTooShortError,
    open_arguments,
    open_stream,
)
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

    banned = {"asyncio", "threading", "pymongo", "time", "django.db", "asgiref"}
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
