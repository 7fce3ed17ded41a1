"""Listings at scale: the API's and the admin's lists over 1,000,000 snapshots.

Run from the repository root::

    .venv/bin/python bench/listings.py [--rebuild] [--repeat N] [--queries] [--only TEXT]

(``--queries`` also prints every query of each listing with its time.)

The data set
------------
A PostgreSQL database of its own (``fw_listings``, or FLOWWARDEN_BENCH_LISTINGS_DB)
holds 10,000 workflow runs of 100 snapshots each (1,000,000 snapshots, each the
child of the one before, every 20th run with a fork; small JSON states, written over
90 days, a run starting every 13 minutes), the runs' rows, and 10 approvals per run
(100,000, one assignee each). It is written once with ``COPY`` and ``VACUUM
ANALYZE``; a later run finds it (by its counts and its version) and reuses it.
``--rebuild`` writes it again. Migrations are applied on every run, so new indexes
are built on the existing rows.

What is timed
-------------
Each listing through the real code path, in process: the API's views through DRF's
request factory, the admin through Django's test client logged in as a superuser.
Three users may read only the runs of the approvals they may decide, 25 runs each:
``alice`` (assigned by name; her runs spread over the 90 days), ``bob`` (by name; the
25 oldest runs, the worst case of a list read newest first) and ``carol`` (through
her group ``finance``). For each listing: the median of *repeat* calls (after one
warm-up call), the number of queries of one more call, the slowest of them (its
time, its first 100 characters and the top of its ``EXPLAIN`` plan), whether any
query read the snapshots' state column, and OK or SLOW against the issue's 100 ms
target. Nothing is asserted.

PostgreSQL: see ``bench/_postgres.py`` (FLOWWARDEN_BENCH_PG_* variables).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _postgres import (  # noqa: E402
    configure_django,
    ensure_database,
    open_raw_connection,
    pg_target,
    server_info,
)

RUNS = 10_000
PER_RUN = 100
APPROVALS_PER_RUN = 10
TARGET_MS = 100.0
WORKFLOWS = ("orders", "refunds", "onboarding", "invoices", "payouts")
STEPS = ("validate", "reserve", "charge", "ship", "notify", "review", "settle", "archive")
APPROVERS = [f"approver-{n:02d}" for n in range(40)]
ALICE = "alice"
#: Every this many runs, one of alice's (25 runs over the whole time range).
ALICE_EVERY = 400
#: bob's runs: the oldest ones (the worst case of a listing that scans newest first).
BOB, BOB_RUNS = "bob", 25
#: carol's group, which may decide the approvals of every ALICE_EVERY-th run after
#: the middle one.
CAROL, GROUP = "carol", "finance"
#: A user who may read the runs of one approver's approvals: about 2,200 runs.
MANY_RUNS = APPROVERS[7]
#: The admin's deep page of the approvals changelist (100 rows a page).
DEEP_PAGE = 999
#: The data set's version, kept as the approval table's comment (a new version rebuilds).
DATA_VERSION = "fw_listings v2"
ADMIN = "bench-admin"
#: The ROOT_URLCONF of the benchmark (this module), filled in by ``install_urls``.
urlpatterns: list[Any] = []


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed calls per listing")
    parser.add_argument("--rebuild", action="store_true", help="write the data set again")
    parser.add_argument(
        "--queries", action="store_true", help="also print every query of each listing"
    )
    parser.add_argument(
        "--only", metavar="TEXT", help="time only the listings whose name contains TEXT"
    )
    return parser.parse_args(argv)


# -- Django ------------------------------------------------------------------------


def setup() -> None:
    """Django on the listings database, with the admin and the API; migrated."""
    target = pg_target()
    target["dbname"] = os.environ.get("FLOWWARDEN_BENCH_LISTINGS_DB", "fw_listings")
    ensure_database(target)
    configure_django(
        target,
        extra_apps=(
            "django.contrib.sessions",
            "django.contrib.messages",
            "django.contrib.admin",
            "rest_framework",
            "django_filters",
        ),
        SECRET_KEY="bench-only",
        ROOT_URLCONF=__name__,
        ALLOWED_HOSTS=["*"],
        STATIC_URL="/static/",
        PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.common.CommonMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": True,
                "OPTIONS": {
                    "context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages",
                    ]
                },
            }
        ],
        FLOWWARDEN={
            "SNAPSHOT_STORES": {
                "default": {"BACKEND": "flowwarden_django.workflows.backends.orm.OrmSnapshotStore"}
            }
        },
    )
    from django.core.management import call_command

    began = time.perf_counter()
    call_command("migrate", verbosity=0)
    took = time.perf_counter() - began
    if took > 2:
        print(f"migrations applied in {took:.1f} s", flush=True)


def install_urls() -> None:
    """The admin under ``admin/`` and the API under ``api/``."""
    from django.contrib import admin
    from django.urls import include, path

    urlpatterns[:] = [
        path("admin/", admin.site.urls),
        path("flowwarden/", include("flowwarden_django.urls")),
        path("api/", include("flowwarden_django.api.urls")),
    ]


# -- the data set --------------------------------------------------------------------


def tables() -> dict[str, str]:
    from flowwarden_django.models import Approval, ApprovalAssignee, SnapshotRecord, WorkflowRun

    return {
        "snapshots": SnapshotRecord._meta.db_table,
        "runs": WorkflowRun._meta.db_table,
        "approvals": Approval._meta.db_table,
        "assignees": ApprovalAssignee._meta.db_table,
    }


def counts(conn: Any) -> dict[str, Any]:
    """The number of rows of each table, and the data set's version."""
    found: dict[str, Any] = {}
    for key, table in tables().items():
        found[key] = conn.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0]
    found["version"] = conn.execute(
        "SELECT obj_description(%s::regclass, 'pg_class')", [tables()["approvals"]]
    ).fetchone()[0]
    return found


def expected_counts() -> dict[str, Any]:
    approvals = RUNS * APPROVALS_PER_RUN
    return {
        "snapshots": RUNS * PER_RUN,
        "runs": RUNS,
        "approvals": approvals,
        "assignees": approvals + (RUNS // ALICE_EVERY + BOB_RUNS) * APPROVALS_PER_RUN,
        "version": DATA_VERSION,
    }


def _ts(moment: datetime) -> str:
    return moment.isoformat()


@dataclasses.dataclass
class Run:
    coordination_id: str
    workflow: str
    status: str
    created_at: datetime
    snapshot_ids: list[str]
    created: list[datetime]


def generate(rng: random.Random) -> Iterator[tuple[Run, list[str]]]:
    """Each run with the COPY lines (text format) of its snapshots."""
    start = datetime(2026, 9, 1, tzinfo=UTC)
    spacing = timedelta(days=90) / RUNS  # a run starts every 13 minutes
    statuses = ["completed"] * 16 + ["failed", "waiting", "running", "hibernated"]
    for index in range(RUNS):
        cid = f"{rng.getrandbits(128):032x}"
        workflow = WORKFLOWS[index % len(WORKFLOWS)]
        at = start + spacing * index
        ids: list[str] = []
        created: list[datetime] = []
        lines = []
        fork = index % 20 == 0
        for seq in range(1, PER_RUN + 1):
            sid = f"{rng.getrandbits(128):032x}"
            parent = ids[-1] if ids else None
            if fork and seq == 71:
                parent = ids[49]  # a branch off #50
            at += timedelta(seconds=rng.randint(1, 60))
            step = "" if seq == 1 else STEPS[(seq - 2) % len(STEPS)]
            state = (
                f'{{"amount":{rng.randint(100, 99999) / 100},"currency":"EUR",'
                f'"customer":"c-{rng.randint(1, 50000)}","items":{rng.randint(1, 9)},'
                f'"order":"ORD-{index:06d}","step":{seq}}}'
            )
            done = "true" if seq == PER_RUN else "false"
            metadata = (
                f'{{"workflow.done":"{done}","workflow.lastStep":"{step}",'
                f'"workflow.name":"{workflow}"}}'
            )
            lines.append(
                f"{sid}\t{parent or chr(92) + 'N'}\t{cid}\t{seq}\t{workflow}\t{state}\tdict\t"
                f"{metadata}\t{_ts(at)}\n"
            )
            ids.append(sid)
            created.append(at)
        status = statuses[index % len(statuses)]
        yield Run(cid, workflow, status, start + spacing * index, ids, created), lines


def build(conn: Any) -> float:
    """Write the data set with COPY; the seconds it took (VACUUM ANALYZE included)."""
    names = tables()
    rng = random.Random(14)
    began = time.perf_counter()
    conn.execute("SET synchronous_commit = off")
    conn.execute(
        "TRUNCATE {} CASCADE".format(", ".join(f'"{names[k]}"' for k in ("snapshots", "runs")))
    )
    conn.execute(f'TRUNCATE "{names["approvals"]}" CASCADE')
    runs: list[Run] = []
    with conn.transaction(), conn.cursor() as cursor:
        columns = "id, parent_id, coordination_id, seq, agent_name, state, state_type, metadata"
        copy_sql = f'COPY "{names["snapshots"]}" ({columns}, created_at) FROM STDIN'
        with cursor.copy(copy_sql) as copy:
            buffer: list[str] = []
            for run, lines in generate(rng):
                runs.append(run)
                buffer.extend(lines)
                if len(buffer) >= 20_000:
                    copy.write("".join(buffer))
                    buffer = []
            copy.write("".join(buffer))
    print(f"  snapshots copied in {time.perf_counter() - began:.1f} s", flush=True)
    with conn.transaction(), conn.cursor() as cursor:
        copy_runs(cursor, names["runs"], runs, rng)
        copy_approvals(cursor, names, runs, rng)
    print(f"  runs and approvals copied in {time.perf_counter() - began:.1f} s", flush=True)
    for table in names.values():
        conn.execute(f'VACUUM ANALYZE "{table}"')
    conn.execute(f"COMMENT ON TABLE \"{names['approvals']}\" IS '{DATA_VERSION}'")
    return time.perf_counter() - began


def copy_runs(cursor: Any, table: str, runs: list[Run], rng: random.Random) -> None:
    columns = (
        "coordination_id, workflow_name, status, last_step, head_snapshot_id, idempotency_key, "
        "failure_reason, resume_input, runner, claimed_until, attempts, created_at, updated_at"
    )
    with cursor.copy(f'COPY "{table}" ({columns}) FROM STDIN') as copy:
        for index, run in enumerate(runs):
            failure = "CardDeclined: insufficient funds" if run.status == "failed" else ""
            copy.write_row(
                (
                    run.coordination_id,
                    run.workflow,
                    run.status,
                    STEPS[(PER_RUN - 2) % len(STEPS)],
                    run.snapshot_ids[-1],
                    f"{run.workflow}:{index:06d}",
                    failure,
                    None,
                    "",
                    None,
                    rng.randint(0, 2) if run.status == "failed" else 0,
                    run.created_at,
                    run.created[-1],
                )
            )


def copy_approvals(cursor: Any, names: dict[str, str], runs: list[Run], rng: random.Random) -> None:
    """10 approvals per run (at snapshots #10, #20, ... #100), each with one assignee;
    the last approval of a waiting run is pending. ``alice`` is assigned as well to
    every approval of every ALICE_EVERY-th run, ``bob`` to those of the oldest runs;
    the group ``finance`` may decide those of every ALICE_EVERY-th run from the
    middle one."""
    columns = (
        "id, coordination_id, workflow_name, step_name, snapshot_id, prompt, "
        '"group", permission, status, requested_at, expires_at, on_expiry, decided_by, '
        "decided_at, comment, payload"
    )
    assignees: list[tuple[str, str]] = []
    with cursor.copy(f'COPY "{names["approvals"]}" ({columns}) FROM STDIN') as copy:
        for index, run in enumerate(runs):
            for n in range(APPROVALS_PER_RUN):
                seq = (n + 1) * (PER_RUN // APPROVALS_PER_RUN)
                pk = f"{rng.getrandbits(128):032x}"
                requested = run.created[seq - 1]
                pending = run.status == "waiting" and n == APPROVALS_PER_RUN - 1
                status = "pending" if pending else rng.choice(["approved"] * 8 + ["rejected"])
                decider = rng.choice(APPROVERS)
                copy.write_row(
                    (
                        pk,
                        run.coordination_id,
                        run.workflow,
                        STEPS[(seq - 2) % len(STEPS)],
                        run.snapshot_ids[seq - 1],
                        f"Approve {run.workflow} ORD-{index:06d} for {rng.randint(1, 999)}.00 EUR?",
                        GROUP if index % ALICE_EVERY == ALICE_EVERY // 2 else "",
                        "",
                        status,
                        requested,
                        requested + timedelta(days=7),
                        "resume",
                        "" if pending else decider,
                        None if pending else requested + timedelta(minutes=rng.randint(1, 600)),
                        "",
                        None,
                    )
                )
                assignees.append((pk, decider))
                if index % ALICE_EVERY == 0:
                    assignees.append((pk, ALICE))
                if index < BOB_RUNS:
                    assignees.append((pk, BOB))
    with cursor.copy(f'COPY "{names["assignees"]}" (approval_id, username) FROM STDIN') as copy:
        for row in assignees:
            copy.write_row(row)


def users() -> dict[str, Any]:
    """The superuser, and alice, bob and carol (in group finance), who may not read
    every run: each sees the runs of the approvals she or he may decide."""
    from django.contrib.auth.models import Group, User

    admin = User.objects.filter(username=ADMIN).first()
    if admin is None:
        admin = User.objects.create_superuser(ADMIN, "admin@example.com", "bench")
    found = {ADMIN: admin}
    for name in (ALICE, BOB, CAROL):
        user = User.objects.filter(username=name).first()
        found[name] = user or User.objects.create_user(name, f"{name}@example.com", "bench")
    found[CAROL].groups.add(Group.objects.get_or_create(name=GROUP)[0])
    # One of the approvers: assigned about 2,500 approvals of about 2,200 runs, more
    # than the API reads run by run (the user who sees more than 100 runs).
    user = User.objects.filter(username=MANY_RUNS).first()
    found[MANY_RUNS] = user or User.objects.create_user(MANY_RUNS, "many@example.com", "bench")
    return found


# -- timing ----------------------------------------------------------------------------


@dataclasses.dataclass
class Query:
    sql: str
    params: Any
    seconds: float


class Recorder:
    """Times every query of the default connection (``connection.execute_wrapper``)."""

    def __init__(self) -> None:
        self.queries: list[Query] = []

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ):
        began = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.queries.append(Query(sql, params, time.perf_counter() - began))


@dataclasses.dataclass
class Row:
    name: str
    median_ms: float
    queries: int
    slowest_ms: float
    slowest_sql: str
    plan: str
    state_read: bool
    all_queries: list[Query]


STATE_COLUMN = re.compile(r'"flowwarden_django_snapshotrecord"\."state"(?!_)')


def plan_of(query: Query) -> str:
    """The top of *query*'s plan: its top node, down to the first scan under it."""
    from django.db import connection

    if not query.sql.lstrip().upper().startswith(("SELECT", "WITH", "(")):
        return "-"
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {query.sql}", query.params)
        value = cursor.fetchone()[0]
    plan = (json.loads(value) if isinstance(value, str) else value)[0]["Plan"]
    parts = []
    node = plan
    while True:
        text = node["Node Type"]
        if node.get("Scan Direction") == "Backward":
            text += " Backward"
        if "Index Name" in node:
            text += f" ({node['Index Name']})"
        elif "Relation Name" in node:
            text += f" ({node['Relation Name'].replace('flowwarden_django_', '')})"
        parts.append(text)
        children = node.get("Plans") or []
        if "Scan" in node["Node Type"] or not children or len(parts) == 3:
            break
        node = children[0]
    return " > ".join(parts)


def measure(name: str, call: Callable[[], Any], repeat: int) -> Row:
    from django.db import connection

    call()  # warm-up
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    recorder = Recorder()
    with connection.execute_wrapper(recorder):
        call()
    slowest = max(recorder.queries, key=lambda q: q.seconds)
    return Row(
        name=name,
        median_ms=statistics.median(times) * 1000,
        queries=len(recorder.queries),
        slowest_ms=slowest.seconds * 1000,
        slowest_sql=" ".join(slowest.sql.split())[:100],
        plan=plan_of(slowest),
        state_read=any(STATE_COLUMN.search(q.sql) for q in recorder.queries),
        all_queries=recorder.queries,
    )


def api_call(path: str, user: Any, **params: str) -> Callable[[], Any]:
    from rest_framework.test import APIRequestFactory, force_authenticate

    from flowwarden_django.api.views import SnapshotViewSet

    view = SnapshotViewSet.as_view({"get": "list"})
    factory = APIRequestFactory()

    def call() -> Any:
        request = factory.get(path, params)
        force_authenticate(request, user=user)
        response = view(request)
        response.render()
        if response.status_code != 200 or not response.data["results"]:
            raise RuntimeError(f"{path} {params}: {response.status_code} {response.data}")
        return response

    return call


def admin_call(client: Any, url: str, expect: str) -> Callable[[], Any]:
    def call() -> Any:
        response = client.get(url)
        if response.status_code != 200 or expect not in response.content.decode():
            raise RuntimeError(f"{url}: {response.status_code}, no {expect!r} in the page")
        return response

    return call


def deep_cursor(conn: Any, depth: int) -> str:
    """The API cursor of the snapshot *depth* rows into the newest-first listing."""
    from flowwarden_django.api.pagination import encode_cursor
    from flowwarden_django.workflows.storage.snapshot import WorkflowSnapshot

    row = conn.execute(
        f'SELECT id, coordination_id, seq, created_at FROM "{tables()["snapshots"]}" '
        "ORDER BY created_at DESC, coordination_id DESC, seq DESC OFFSET %s LIMIT 1",
        [depth],
    ).fetchone()
    return encode_cursor(
        WorkflowSnapshot(id=row[0], coordination_id=row[1], seq=row[2], created_at=row[3])
    )


def listings(conn: Any, people: dict[str, Any]) -> list[tuple[str, Callable[[], Any]]]:
    """The timed listings, by name."""
    from django.test import Client

    names = tables()
    middle = conn.execute(
        f'SELECT coordination_id FROM "{names["runs"]}" ORDER BY created_at OFFSET %s LIMIT 1',
        [RUNS // 2],
    ).fetchone()[0]
    admin = people[ADMIN]
    client = Client()
    client.force_login(admin)
    snapshots = "/api/v1/snapshots/"
    runs_url = "/admin/flowwarden_django/workflowrun/"
    approvals_url = "/admin/flowwarden_django/approval/"
    return [
        ("API snapshots, first page", api_call(snapshots, admin)),
        ("API snapshots, first page (alice)", api_call(snapshots, people[ALICE])),
        ("API snapshots, first page (bob)", api_call(snapshots, people[BOB])),
        ("API snapshots, first page (carol)", api_call(snapshots, people[CAROL])),
        (
            f"API snapshots, first page ({MANY_RUNS}: >100 runs)",
            api_call(snapshots, people[MANY_RUNS]),
        ),
        (
            "API snapshots, keyset page at 500,000",
            api_call(snapshots, admin, cursor=deep_cursor(conn, RUNS * PER_RUN // 2)),
        ),
        ("API snapshots of one run", api_call(snapshots, admin, coordination=middle)),
        ("admin runs changelist", admin_call(client, runs_url, 'class="paginator"')),
        (
            "admin snapshot tree, first page",
            admin_call(client, f"{runs_url}{middle}/tree/", "flowwarden-tree-count"),
        ),
        ("admin approvals changelist", admin_call(client, approvals_url, 'class="paginator"')),
        (
            "admin approvals, status=pending",
            admin_call(client, f"{approvals_url}?status__exact=pending", 'class="paginator"'),
        ),
        (
            "admin approvals, search ?q=ORD-004242",
            admin_call(client, f"{approvals_url}?q=ORD-004242", 'class="paginator"'),
        ),
        (
            f"admin approvals, page ?p={DEEP_PAGE}",
            admin_call(client, f"{approvals_url}?p={DEEP_PAGE}", 'class="paginator"'),
        ),
        (
            f"admin runs, page ?p={DEEP_PAGE // 10}",
            admin_call(client, f"{runs_url}?p={DEEP_PAGE // 10}", 'class="paginator"'),
        ),
    ]


def print_queries(rows: list[Row]) -> None:
    for row in rows:
        print(f"\n{row.name}:")
        for query in row.all_queries:
            print(f"  {query.seconds * 1000:6.1f} ms  {' '.join(query.sql.split())[:150]}")


def print_table(rows: list[Row]) -> None:
    print()
    print(
        f"{'listing':<40} {'median':>8} {'queries':>7} {'slowest':>8}  "
        f"{'state':<5} {'verdict':<7} slowest query / its plan"
    )
    for row in rows:
        verdict = "OK" if row.median_ms < TARGET_MS else "SLOW"
        print(
            f"{row.name:<40} {row.median_ms:6.1f}ms {row.queries:>7} {row.slowest_ms:6.1f}ms  "
            f"{'read' if row.state_read else 'no':<5} {verdict:<7} {row.slowest_sql}"
        )
        print(f"{'':<88} plan: {row.plan}")


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main(argv: list[str] | None = None) -> int:
    """Build (or reuse) the data set, time each listing and print the table."""
    args = parse_args(argv)
    setup()
    install_urls()
    version, _ = server_info()
    print(f"PostgreSQL {version}; load average {load()}", flush=True)
    conn = open_raw_connection()
    found = counts(conn)
    if args.rebuild or found != expected_counts():
        print(f"building the data set (found {found})", flush=True)
        took = build(conn)
        print(f"data set built in {took:.1f} s: {counts(conn)}", flush=True)
    else:
        print(f"data set reused: {found}", flush=True)
        # As autovacuum would have done (this machine's server runs without it): a
        # visibility map left stale by an earlier run makes index-only scans read
        # every row from the table after all.
        for table in tables().values():
            conn.execute(f'VACUUM "{table}"')
    timed = listings(conn, users())
    if args.only:
        timed = [(name, call) for name, call in timed if args.only in name]
    rows = [measure(name, call, args.repeat) for name, call in timed]
    if args.queries:
        print_queries(rows)
    print_table(rows)
    print(f"\nmedian of {args.repeat} calls each; target {TARGET_MS:.0f} ms; load average {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
