"""Chaos: stream consumers while their checkpoint server restarts (issue 17, "Streams
heal by themselves" and "Errors logged once per state change").

Each scenario runs one consumer on its own thread (a ``StreamConsumer``, and again an
``AsyncStreamConsumer`` on its own event loop) against the in-process
fake change source, fed live with 5,000 inserts (``stream_feed.Feeder``), while a
private server (``tests/chaos/servers.py``) restarts under it:

1. non-transactional, ORM checkpoint store on the private PostgreSQL, the handler
   writing one ``Effect`` row per event there too; PostgreSQL restarted twice
   (``immediate``: like a crash of the server);
2. transactional (the handler's row and the processed anchor in one transaction on
   the private PostgreSQL); the same two restarts;
3. the Redis checkpoint store on a private Redis without persistence, restarted
   under load (it comes back empty).

Nobody intervenes: the stream must finish every event by itself. Each scenario prints
one ``chaos [...]`` line: events lost (must be 0), duplicates (0 in transactional mode;
at most ``save_every_n`` per interruption otherwise), seconds from each server's return
to the next event handled (at most 10 s) and the log records of the
``flowwarden_django`` loggers (INFO and up) during the outages (bounded: no line per
event).

A *delivery* is a completed handling: recorded after the handler's write returned
(non-transactional), or once the transaction committed (transactional,
``transaction.on_commit``). An attempt whose write failed is counted apart
(``failed_attempts``): its event is not settled and comes again.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import DatabaseError, connections, transaction
from django.db.models import Count

from flowwarden_django.streams.backends.orm import OrmCheckpointStore
from flowwarden_django.streams.backends.redis import RedisCheckpointStore
from flowwarden_django.streams.checkpoint import CheckpointStore
from flowwarden_django.streams.runtime import StreamConsumer, StreamState
from flowwarden_django.streams.spec import CheckpointSpec, StreamSpec
from tests.chaos.report import report
from tests.chaos.servers import PrivatePostgres, PrivateRedis, PrivateServer
from tests.chaos.stream_feed import (
    AwaitingSource,
    CheckpointWrites,
    ConsumerThread,
    Deliveries,
    Feeder,
    LogCounter,
    token_position,
    wait_until,
)
from tests.streams.managers import RUNNERS, consumer_class
from tests.testapp.models import Effect

pytestmark = pytest.mark.chaos

EVENTS = 5_000
#: Inserts per second the feeder appends: the feed lasts ~10 s, across both restarts.
FEED_RATE = 500
SAVE_EVERY_N = 50
#: The PostgreSQL restarts: (seconds after the feed starts, seconds down).
PG_RESTARTS = ((1.5, 2.5), (6.0, 2.5))
#: Seconds from a server's return to the next event handled (issue 17: streams <= 10 s).
MAX_RECOVERY_S = 10.0
#: Log records (INFO and up) the package may write during one outage.
MAX_LOG_LINES_PER_OUTAGE = 50
#: How long the whole scenario may take, from the first event to the last, before the
#: test gives up: a liveness deadline, generous for a loaded machine (a run that heals
#: ends long before it; the recovery figures are checked separately).
DEADLINE_S = 180.0
#: ``FailureLog``'s messages when a failure starts and when it ends.
FAILURE_STARTED = "%s failed: %s: %s"
FAILURE_ENDED = "%s works again after %d failed attempts in %.1f s"


def _spec(name: str, handler: Callable[..., Any], **options: Any) -> StreamSpec:
    return StreamSpec(
        name=name,
        collection="orders",
        handlers={"insert": handler},
        checkpoint=CheckpointSpec(
            save_every_n=options.pop("save_every_n", SAVE_EVERY_N),
            # The idle heartbeat runs (and fails) during the outages too.
            idle_heartbeat_interval_seconds=1,
        ),
        # The default restart policy (1 s, doubling, 60 s max): the outage cap
        # (``core.lifecycle.OUTAGE_RESTART_MAX_SECONDS``) is what brings the stream back promptly.
        **options,
    )


def _close_connection(alias: str) -> None:
    """Drop this thread's connection of *alias* (a restart broke it)."""
    with contextlib.suppress(DatabaseError):
        connections[alias].close()


Consumer = StreamConsumer


@pytest.fixture(autouse=True, params=RUNNERS)
def runner(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every scenario runs on both runtimes: ``Consumer`` is the runner's consumer class."""
    monkeypatch.setitem(globals(), "Consumer", consumer_class(request.param))
    return request.param


class Scenario:
    """One consumer, one feed, one private server restarted under it; the figures."""

    def __init__(
        self,
        title: str,
        spec: StreamSpec,
        store: CheckpointStore,
        server: PrivateServer,
        deliveries: Deliveries,
    ) -> None:
        self.title = title
        self.spec = spec
        self.store = store
        self.server = server
        self.deliveries = deliveries
        self.source = AwaitingSource()
        self.feeder = Feeder(self.source.oplog, EVENTS, FEED_RATE)
        self.consumer = Consumer(spec, store, lambda s: self.source)
        self.duration = 0.0

    def run(
        self,
        restarts: tuple[tuple[float, float], ...],
        mode: str,
        handled_elsewhere: Callable[[], bool] | None = None,
    ) -> None:
        """Feed, restart the server as told, wait until every event was handled once
        (in memory, or as *handled_elsewhere* tells)."""
        thread = ConsumerThread(self.consumer)
        with LogCounter() as self.logs, CheckpointWrites(self.spec.name) as self.writes:
            started = time.monotonic()
            thread.start()
            # The bootstrap (the first level of the cascade) before the first event.
            assert wait_until(lambda: self.consumer.state == StreamState.RUNNING, 10), (
                f"the stream did not start: {self.consumer.last_error!r}"
            )
            self.feeder.start()
            for after, down in restarts:
                self.server.restart_in_background(after=after, down=down, mode=mode)
            finished = wait_until(
                lambda: (
                    self.deliveries.distinct >= EVENTS
                    or not thread.is_alive()
                    or (handled_elsewhere is not None and handled_elsewhere())
                ),
                DEADLINE_S,
            )
            self.server.join_background()
            thread.stop()
            self.duration = time.monotonic() - started
        self.feeder.join(5)
        assert thread.error is None, f"the stream died: {thread.error!r}"
        assert finished, (
            f"{self.title}: {self.deliveries.distinct} of {EVENTS} events handled after "
            f"{DEADLINE_S} s (state {self.consumer.state}, last error "
            f"{self.consumer.last_error!r}); no human action may be needed"
        )
        assert len(self.server.outages) == len(restarts)

    # -- figures -------------------------------------------------------------------

    def recovery(self, first_after: Callable[[float], float | None]) -> list[float | None]:
        """Seconds from each server return to the first *first_after* event after it."""
        result: list[float | None] = []
        for _, came_back in self.server.outages:
            moment = first_after(came_back)
            result.append(None if moment is None else round(moment - came_back, 2))
        return result

    def outage_logs(self) -> list[int]:
        """Log records during each outage (from the stop signal to the server's answer)."""
        return [len(self.logs.between(down, back)) for down, back in self.server.outages]

    def duplicates_per_interruption(self) -> list[int]:
        """Repeated deliveries from each outage's start to the next one's."""
        starts = [down for down, _ in self.server.outages] + [float("inf")]
        return [
            self.deliveries.duplicates_between(starts[i], starts[i + 1])
            for i in range(len(starts) - 1)
        ]

    def check_recovery_and_logs(self, recovery: list[float | None]) -> None:
        assert all(r is not None and r <= MAX_RECOVERY_S for r in recovery), (
            f"{self.title}: seconds from the server's return to events flowing: {recovery}"
        )
        during = self.outage_logs()
        records = [record for _, record in self.logs.records]
        assert all(n <= MAX_LOG_LINES_PER_OUTAGE for n in during), (
            f"{self.title}: {during} log records during the outages; the first ones:\n"
            + self.logs.summary(self.logs.between(*self.server.outages[0]))
        )
        # Not one line per event: the whole run logs far fewer records than events.
        assert len(records) <= EVENTS // 50, (
            f"{self.title}: {len(records)} log records for {EVENTS} events:\n"
            + self.logs.summary(records)
        )
        # Once per state change: each failing operation (``FailureLog``) that said it
        # started failing also says it works again, now that the server is back.
        started = {r.args[0] for r in records if r.msg == FAILURE_STARTED and r.args}
        recovered = {r.args[0] for r in records if r.msg == FAILURE_ENDED and r.args}
        assert started <= recovered, (
            f"{self.title}: no recovery line for {sorted(started - recovered)}"
        )

    def line(self, *, lost: int, duplicates: int, recovery: list[Any], **extra: Any) -> str:
        tracebacks = sum(1 for _, record in self.logs.records if record.exc_info)
        text = (
            f"chaos [{self.title}]: events={EVENTS} lost={lost} duplicates={duplicates} "
            f"(save_every_n={self.spec.checkpoint.save_every_n}, "
            f"interruptions={len(self.server.outages)}) recovery_s={recovery} "
            f"log_lines_during_outages={sum(self.outage_logs())}"
        )
        extra.update(
            log_lines_total=len(self.logs.records),
            tracebacks=tracebacks,
            restarts=self.consumer.restarts,
            failed_attempts=self.deliveries.failed_attempts,
            duration_s=round(self.duration, 1),
        )
        return text + " " + " ".join(f"{key}={value}" for key, value in extra.items())


# -- 1. non-transactional, PostgreSQL restarted twice ------------------------------------


def test_non_transactional_stream_heals_across_two_postgres_restarts(
    private_postgres: PrivatePostgres, private_postgres_alias: str
) -> None:
    alias, name = private_postgres_alias, "chaos-plain"
    deliveries = Deliveries()

    def on_insert(doc: dict[str, Any], ctx: Any) -> None:
        try:
            Effect.objects.using(alias).create(order_id=doc["n"], stream=name)
        except Exception:
            deliveries.failed()
            raise
        deliveries.record(doc["n"])

    store = OrmCheckpointStore(using=alias)
    store.delete(name)
    Effect.objects.using(alias).filter(stream=name).delete()
    scenario = Scenario(
        "stream, non-transactional, postgres x2",
        _spec(name, on_insert),
        store,
        private_postgres,
        deliveries,
    )
    scenario.run(PG_RESTARTS, mode="immediate")
    _close_connection(alias)

    positions = scenario.feeder.positions
    lost = deliveries.lost(range(1, EVENTS + 1))
    recovery = scenario.recovery(deliveries.first_after)
    per_interruption = scenario.duplicates_per_interruption()
    duplicates = deliveries.duplicates()

    # Every processed anchor ever written was behind the handling: a consumer started
    # from any of them would have skipped nothing.
    first_handled: dict[int, float] = {}
    for at, event_id in deliveries.log:
        first_handled.setdefault(event_id, at)
    by_position = sorted((position, n) for n, position in positions.items())
    ahead = []
    for written_at, anchor in scenario.writes.anchors:
        covered = [n for position, n in by_position if position <= anchor]
        if any(first_handled.get(n, float("inf")) > written_at for n in covered):
            ahead.append(anchor)

    # The stored anchor, and a fresh consumer resuming from it.
    saved = store.find(name)
    anchor = token_position(saved.last_processed_token if saved else None)
    last_handled = max((positions[n] for n in deliveries.counts), default=0)
    resumed = Deliveries()
    fresh = Consumer(
        _spec(name, lambda doc, ctx: resumed.record(doc["n"])), store, lambda s: scenario.source
    )
    fresh.run(burst=True)
    connections[alias].close()
    after_anchor = {n for n, position in positions.items() if position > anchor}

    report(
        "\n"
        + scenario.line(
            lost=len(lost),
            duplicates=duplicates,
            recovery=recovery,
            duplicates_per_interruption=per_interruption,
            anchor_writes=len(scenario.writes.anchors),
        )
    )
    assert not lost, f"lost events: {lost[:20]}"
    assert all(n <= SAVE_EVERY_N for n in per_interruption), per_interruption
    assert duplicates <= SAVE_EVERY_N * len(private_postgres.outages)
    assert not ahead, f"anchors written ahead of the handling: {ahead[:5]}"
    assert anchor <= last_handled
    assert all(n in deliveries.counts for n, p in positions.items() if p <= anchor)
    assert set(resumed.counts) == after_anchor, "a fresh consumer skipped or repeated events"
    scenario.check_recovery_and_logs(recovery)


# -- 2. transactional, PostgreSQL restarted twice ----------------------------------------


def every_row_committed(alias: str, name: str) -> Callable[[], bool]:
    """Whether every event's row is in the table, read at most once a second (False
    while the server is down). The table is a transactional stream's truth: a COMMIT
    whose answer a restart cut off is there, and its event, behind the anchor it
    committed, is rightly not delivered again, so no ``on_commit`` ever counts it."""
    last_read = [0.0]

    def complete() -> bool:
        if time.monotonic() - last_read[0] < 1.0:
            return False
        last_read[0] = time.monotonic()
        rows = Effect.objects.using(alias).filter(stream=name)
        try:
            return rows.values("order_id").distinct().count() >= EVENTS
        except DatabaseError:
            connections[alias].close()
            return False

    return complete


def test_transactional_stream_has_no_duplicate_across_two_postgres_restarts(
    private_postgres: PrivatePostgres, private_postgres_alias: str
) -> None:
    alias, name = private_postgres_alias, "chaos-transactional"
    deliveries = Deliveries()

    def on_insert(doc: dict[str, Any], ctx: Any) -> None:
        n = doc["n"]
        try:
            Effect.objects.using(alias).create(order_id=n, stream=name)
        except Exception:
            deliveries.failed()
            raise
        # Counted only once the row and the anchor are committed.
        transaction.on_commit(lambda: deliveries.record(n), using=alias)

    store = OrmCheckpointStore(using=alias)
    store.delete(name)
    Effect.objects.using(alias).filter(stream=name).delete()
    scenario = Scenario(
        "stream, transactional, postgres x2",
        _spec(name, on_insert, transactional=True, transaction_using=alias),
        store,
        private_postgres,
        deliveries,
    )
    scenario.run(PG_RESTARTS, mode="immediate", handled_elsewhere=every_row_committed(alias, name))
    _close_connection(alias)

    # The table is the truth: a COMMIT whose answer was lost is in it, not in memory.
    rows = Effect.objects.using(alias).filter(stream=name)
    per_order = dict(rows.values_list("order_id").annotate(n=Count("id")))
    lost = [n for n in range(1, EVENTS + 1) if n not in per_order]
    duplicate_rows = sum(count - 1 for count in per_order.values())
    saved = store.find(name)
    anchor = token_position(saved.last_processed_token if saved else None)
    connections[alias].close()
    recovery = scenario.recovery(deliveries.first_after)

    report(
        "\n"
        + scenario.line(
            lost=len(lost),
            duplicates=duplicate_rows,
            recovery=recovery,
            rows=sum(per_order.values()),
            committed_deliveries=sum(deliveries.counts.values()),
        )
    )
    assert not lost, f"events without a row: {lost[:20]}"
    assert duplicate_rows == 0, "an event's row was committed twice"
    assert set(per_order) == set(range(1, EVENTS + 1))
    assert anchor == scenario.feeder.positions[EVENTS], "the anchor is not the last event"
    scenario.check_recovery_and_logs(recovery)


# -- 3. Redis checkpoint store, Redis restarted (and emptied) ----------------------------


def test_redis_checkpoint_store_rewrites_the_checkpoint_after_a_redis_restart(
    private_redis: PrivateRedis,
) -> None:
    name = "chaos-redis"
    deliveries = Deliveries()
    store = RedisCheckpointStore(url=private_redis.url, key_prefix="fw-chaos:")
    scenario = Scenario(
        "stream, redis checkpoint store, redis x1 (no persistence)",
        _spec(name, lambda doc, ctx: deliveries.record(doc["n"])),
        store,
        private_redis,
        deliveries,
    )
    try:
        scenario.run(((2.0, 3.0),), mode="term")
        saved = store.find(name)
    finally:
        store.close()

    lost = deliveries.lost(range(1, EVENTS + 1))
    duplicates = deliveries.duplicates()
    recovery = scenario.recovery(deliveries.first_after)
    # The server came back empty: how long until the stream's checkpoint existed again.
    rewritten = scenario.recovery(lambda moment: scenario.writes.first_after(moment))
    anchor = token_position(saved.last_processed_token if saved else None)

    report(
        "\n"
        + scenario.line(
            lost=len(lost),
            duplicates=duplicates,
            recovery=recovery,
            checkpoint_rewritten_s=rewritten,
            anchor_writes=len(scenario.writes.anchors),
        )
    )
    assert not lost, f"lost events: {lost[:20]}"
    assert duplicates <= SAVE_EVERY_N * len(private_redis.outages)
    assert all(r is not None and r <= MAX_RECOVERY_S for r in rewritten), (
        f"the checkpoint was not rewritten within {MAX_RECOVERY_S} s of Redis' return: {rewritten}"
    )
    assert anchor == scenario.feeder.positions[EVENTS], "the stored anchor is not the last event"
    scenario.check_recovery_and_logs(recovery)
