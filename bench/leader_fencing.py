"""What fencing costs: a SINGLE_LEADER stream's events per second against the same
stream without a lease.

Run from the repository root::

    .venv/bin/python bench/leader_fencing.py [--events N] [--rounds N] [--warmup N]

What is measured
----------------
Both paths run ``StreamConsumer.run(burst=True)`` over the same ``N`` insert events
of the in-process fake change source (``flowwarden_django.testkit.fake_source``, so
no MongoDB I/O blurs the difference), with the same no-op handler, as a
**transactional** stream whose processed anchor is written after every event by the
ORM checkpoint store on PostgreSQL (``save_every_n=1``): one transaction per event.

1. **Fenced** (``SINGLE_LEADER``): the consumer holds a lease of the ORM lock service
   on the same database and writes each anchor inside ``guard(lease)``: within the
   event's transaction it locks the lease row (``SELECT ... FOR UPDATE``), checks
   owner, token and expiry, then upserts the anchor. It also checks its lease's local
   validity before each event.
2. **Unfenced** (``ALL_INSTANCES``): the same consumer, the same transaction, the
   anchor upsert alone.

The ratio (fenced / unfenced) is the share of throughput a stream keeps when it is
made single-leader: the price of never letting a deposed leader move the anchors.
Rounds alternate which path goes first, after a warm-up of each; medians are
reported. Database settings as in ``bench/checkpoint_writes.py`` (PostgreSQL at
127.0.0.1:5432, database ``fw_bench``; FLOWWARDEN_BENCH_PG_* override).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _postgres import configure_django, ensure_database, pg_target, server_info  # noqa: E402

FENCED, UNFENCED = "bench.leader_fencing.fenced", "bench.leader_fencing.unfenced"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=3000, help="events per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per path")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds per path")
    return parser.parse_args(argv)


def handle(doc: Any) -> None:
    """The no-op handler of both paths."""


def run_round(name: str, events: int, *, fenced: bool) -> float:
    """Consume *events* fresh inserts once; return events per second."""
    from django.utils import timezone

    from flowwarden_django.streams.backends.orm import OrmCheckpointStore, OrmLockService
    from flowwarden_django.streams.runtime.leadership import Leadership
    from flowwarden_django.streams.runtime.observed_store import ObservedCheckpointStore
    from flowwarden_django.streams.runtime.threaded import StreamConsumer
    from flowwarden_django.streams.spec import CheckpointSpec, StreamSpec
    from flowwarden_django.testkit.fake_source import FakeChangeSource

    source = FakeChangeSource()
    store = OrmCheckpointStore(using="default")
    store.delete(name)
    now = timezone.now()
    store.save_seen(name, source.initial_position(), now, heartbeat_at=now)
    for n in range(events):
        source.oplog.insert({"_id": n})
    spec = StreamSpec(
        name=name,
        collection="orders",
        handlers={"insert": handle},
        transactional=True,
        deployment_mode="SINGLE_LEADER" if fenced else "ALL_INSTANCES",
        checkpoint=CheckpointSpec(save_every_n=1, save_interval_seconds=0),
    )
    lease_valid = None
    consumer_store: Any = store
    if fenced:
        leadership = Leadership(
            name,
            OrmLockService(using="default"),
            "bench",
            ttl=600,
            renew_interval=60,
            poll_interval=60,
        )
        assert leadership.try_lead()
        consumer_store = ObservedCheckpointStore(store, name, fence=leadership.fence)
        lease_valid = leadership.is_valid
    consumer = StreamConsumer(spec, consumer_store, lambda s: source, lease_valid=lease_valid)
    started = time.perf_counter()
    consumer.run(burst=True)
    seconds = time.perf_counter() - started
    if consumer.events_handled != events:
        sys.exit(f"{name}: handled {consumer.events_handled} of {events} events")
    if fenced:
        leadership.release()
    return events / seconds


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its results."""
    args = parse_args(argv)
    target = pg_target()
    ensure_database(target)
    configure_django(target)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    version, synchronous_commit = server_info()
    print(
        f"PostgreSQL {version} at {target['host']}:{target['port']}/{target['dbname']}, "
        f"synchronous_commit={synchronous_commit}; {args.rounds} rounds x {args.events} events"
    )
    for _ in range(args.warmup):
        run_round(FENCED, args.events, fenced=True)
        run_round(UNFENCED, args.events, fenced=False)
    fenced, unfenced = [], []
    for index in range(args.rounds):
        order = [(True, fenced), (False, unfenced)]
        for is_fenced, results in order if index % 2 == 0 else reversed(order):
            results.append(
                run_round(FENCED if is_fenced else UNFENCED, args.events, fenced=is_fenced)
            )
    fenced_rate, unfenced_rate = statistics.median(fenced), statistics.median(unfenced)
    print(f"SINGLE_LEADER, fenced writes:    {fenced_rate:,.0f} events/s")
    print(f"ALL_INSTANCES, unfenced writes:  {unfenced_rate:,.0f} events/s")
    print(f"ratio (fenced / unfenced):       {fenced_rate / unfenced_rate:.2f}")
    from flowwarden_django.models import StreamCheckpoint, StreamLease

    StreamCheckpoint.objects.filter(stream_name__in=[FENCED, UNFENCED]).delete()
    StreamLease.objects.filter(name=FENCED).delete()
    return 0


if __name__ == "__main__":
    sys.exit(main())
