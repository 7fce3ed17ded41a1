"""The API's snapshot list for a user who may read only some runs, beside a store
holding one large run they may not read.

Run from the repository root::

    .venv/bin/python bench/snapshot_listing.py [--snapshots N] [--state-kb K] [--repeat N]

What is measured
----------------
PostgreSQL, the ORM snapshot store with encryption at rest (AES-256-GCM). One run
that nobody in the benchmark may read holds *snapshots* snapshots (default 5,000)
of *state-kb* KB states (default 40), written newer than everything else; a small
run waits for an approval assigned to ``alice``. Each timed call is one
``GET /api/v1/snapshots/`` (the first page, 50 rows), answered by the API's view
in process (DRF request factory, no HTTP):

1. **restricted**: ``alice``, who sees only the runs of her approvals: the store
   filters them in SQL and never reads a state.
2. **everything** (the baseline): a holder of ``view_snapshotrecord``, whose first
   page is 50 of the large run's rows.
3. **states read** (what the list cost before): the same filtered page, listed
   with its states read and decrypted, as the API did when it scanned rows in
   Python.

The median of *repeat* calls is printed for each, with the ratios. The issue's
target: the restricted list answers in under 0.3 s.

PostgreSQL: see ``bench/_postgres.py`` (FLOWWARDEN_BENCH_PG_* variables).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _postgres import configure_django, ensure_database, pg_target, server_info  # noqa: E402

BIG = "bench-list:payroll"
PREFIX = "bench-list"
KEY = "bmV2ZXItdXNlLXRoaXMta2V5LWZvci1hbnl0aGluZyE="  # 32 bytes, for the benchmark only


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snapshots", type=int, default=5000, help="snapshots of the large run")
    parser.add_argument("--state-kb", type=int, default=40, help="KB of state per snapshot")
    parser.add_argument("--repeat", type=int, default=9, help="timed calls per listing")
    return parser.parse_args(argv)


def setup() -> None:
    """Django on the benchmark database, with DRF and an encrypting default store."""
    target = pg_target()
    ensure_database(target)
    configure_django(
        target,
        extra_apps=("rest_framework", "django_filters"),
        SECRET_KEY="bench-only",
        ROOT_URLCONF="flowwarden_django.api.urls",
        ALLOWED_HOSTS=["*"],
        FLOWWARDEN={
            "SNAPSHOT_STORES": {
                "default": {
                    "BACKEND": "flowwarden_django.workflows.backends.orm.OrmSnapshotStore",
                    "OPTIONS": {"encryption_keys": [KEY]},
                }
            }
        },
    )
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def cleanup() -> None:
    """Delete the benchmark's rows."""
    from django.contrib.auth.models import User

    from flowwarden_django.models import Approval, SnapshotRecord, WorkflowRun

    Approval.objects.filter(coordination_id__startswith=PREFIX).delete()
    SnapshotRecord.objects.filter(coordination_id__startswith=PREFIX).delete()
    WorkflowRun.objects.filter(coordination_id__startswith=PREFIX).delete()
    User.objects.filter(username__startswith="bench-list-").delete()


def build(snapshots: int, state_kb: int) -> tuple[Any, Any]:
    """The large run (bulk-inserted as the store writes rows), a small waiting run
    with an approval for ``bench-list-alice``; the two users."""
    from django.contrib.auth.models import Permission, User

    from flowwarden_django.models import SnapshotRecord
    from flowwarden_django.workflows import Workflow, await_approval, done, snapshot_stores, step
    from flowwarden_django.workflows.storage.snapshot import WorkflowSnapshot

    alice = User.objects.create_user("bench-list-alice")
    viewer = User.objects.create_user("bench-list-viewer")
    viewer.user_permissions.add(Permission.objects.get(codename="view_snapshotrecord"))
    viewer = User.objects.get(pk=viewer.pk)

    @step("ask")
    def ask(state: dict[str, Any]) -> Any:
        return await_approval(state, "Refund?", assignees=["bench-list-alice"])

    @step("finish")
    def finish(state: dict[str, Any]) -> Any:
        return done(state)

    Workflow.define("bench-list", [ask, finish])
    Workflow.start("bench-list", {"amount": 5}, coordination_id=f"{PREFIX}:small")

    store = snapshot_stores["default"]
    filler = "x" * (state_kb * 1024)
    start = datetime.now(UTC) + timedelta(days=1)  # newer than the small run
    rows, parent = [], None
    began = time.perf_counter()
    for seq in range(1, snapshots + 1):
        snapshot = WorkflowSnapshot(
            id=f"bench-list-{seq:07d}",
            coordination_id=BIG,
            state={"salary": filler, "seq": seq},
            parent_id=parent,
            seq=seq,
            created_at=start + timedelta(milliseconds=seq),
        )
        rows.append(SnapshotRecord(id=snapshot.id, seq=seq, **store._columns(snapshot)))
        parent = snapshot.id
        if len(rows) == 500:
            SnapshotRecord.objects.bulk_create(rows)
            rows = []
    SnapshotRecord.objects.bulk_create(rows)
    print(
        f"built {snapshots} snapshots of {state_kb} KB (encrypted) in "
        f"{time.perf_counter() - began:.1f} s",
        flush=True,
    )
    return alice, viewer


def list_view() -> Any:
    from flowwarden_django.api.views import SnapshotViewSet

    return SnapshotViewSet.as_view({"get": "list"})


def time_api(user: Any, repeat: int) -> tuple[float, int]:
    """The median seconds of the first page for *user*, and its row count."""
    from rest_framework.test import APIRequestFactory, force_authenticate

    view, factory, times, count = list_view(), APIRequestFactory(), [], 0
    for _ in range(repeat):
        request = factory.get("/v1/snapshots/")
        force_authenticate(request, user=user)
        start = time.perf_counter()
        response = view(request)
        response.render()
        times.append(time.perf_counter() - start)
        assert response.status_code == 200, response.content
        count = len(response.data["results"])
    return statistics.median(times), count


def time_states_read(user: Any, repeat: int) -> float:
    """The median seconds of the same filtered page, listed with its states."""
    from flowwarden_django.api.permissions import SnapshotAccess
    from flowwarden_django.workflows import snapshot_stores
    from flowwarden_django.workflows.storage.snapshot import CheckpointQuery

    store, times = snapshot_stores["default"], []
    for _ in range(repeat):
        start = time.perf_counter()
        access = SnapshotAccess.of(user)
        query = CheckpointQuery(newest_first=True, limit=51)
        # As before the fix: batches of 500 rows with their states, kept in Python.
        kept: list[Any] = []
        batch = dataclasses.replace(query, limit=500)
        while batch is not None and len(kept) < 51:
            rows = store.list(batch)
            kept += [row for row in rows if access.allows(row.coordination_id)]
            batch = batch.next_page(rows)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its results."""
    args = parse_args(argv)
    setup()
    version, synchronous_commit = server_info()
    print(f"PostgreSQL {version}, synchronous_commit={synchronous_commit}", flush=True)
    cleanup()
    try:
        alice, viewer = build(args.snapshots, args.state_kb)
        time_api(alice, 2)  # warm-up
        restricted, rows = time_api(alice, args.repeat)
        everything, all_rows = time_api(viewer, args.repeat)
        before = time_states_read(alice, max(3, args.repeat // 3))
    finally:
        cleanup()
    print(f"restricted user, first page ({rows} rows):      {restricted * 1000:8.1f} ms")
    print(f"all-access user, first page ({all_rows} rows):      {everything * 1000:8.1f} ms")
    print(f"states read and filtered in Python (before): {before * 1000:8.1f} ms")
    print(f"ratio (restricted / all-access):             {restricted / everything:8.2f}")
    print(f"speed-up (before / restricted):              {before / restricted:8.0f}x")
    verdict = "under" if restricted < 0.3 else "OVER"
    print(f"restricted list {verdict} the 0.3 s target")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
