"""README command 1 and the sample's stream: they run on SQLite with no servers."""

import json
import os
import re
import sqlite3
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from flowwarden_django.testkit.scripted_mongo import ScriptedReplicaSet

#: It runs processes of its own (the sample project, a child interpreter).
pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[2]


def run(*args, env, timeout=300):
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


#: The fields of an order the ``Order`` mirror keeps.
FIELDS = ("customer", "status", "total_cents")


def existing_order(order_id):
    """An order the demo pre-seeds before the stream's first start (as its
    ``existing_order`` writes it): the fields the ``Order`` mirror keeps."""
    return (
        f"c{order_id % 41}",
        ("delivered", "delivered", "shipped", "cancelled")[order_id % 4],
        500 + (order_id * 7_919) % 150_000,
    )


def mirrored(env, first, last):
    """``{order_id: (customer, status, total_cents)}`` of the sample database's
    ``Order`` rows from *first* to *last*."""
    with sqlite3.connect(env["SAMPLEPROJECT_DB"]) as db:
        rows = db.execute(
            "SELECT order_id, customer, status, total_cents FROM shop_order "
            "WHERE order_id BETWEEN ? AND ?",
            (first, last),
        ).fetchall()
    return {order_id: tuple(fields) for order_id, *fields in rows}


@pytest.fixture
def sample_env(tmp_path):
    env = {**os.environ, "SAMPLEPROJECT_DB": str(tmp_path / "demo.sqlite3")}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("FLOWWARDEN_MONGO_URL", None)
    migrated = run("migrate", "--noinput", "-v", "0", env=env)
    assert migrated.returncode == 0, migrated.stderr
    return env


def test_demo_runs_the_whole_story(sample_env):
    """README command 1: the initial sync of the pre-seeded orders (with an insert and
    an update written during the copy), the stream, the workflows it starts once per
    new order, two approvals decided, the snapshot chain and the decision printed."""
    for _ in range(2):  # a second run works on the existing data
        result = run("demo", "--orders", "120", "--existing", "1200", env=sample_env)
        assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "scripted replica set" in out
    # The initial sync: 1,200 pre-seeded orders, copied in 3 batches, then the two
    # changes made during the copy (order 1201 inserted, order 7 updated).
    assert "Pre-seeded 1,200 existing orders in shop.orders" in out
    assert (
        "first start: copies the existing orders, then streams: "
        "1,201 documents copied, 2 events handled"
    ) in out
    assert re.search(
        r"Initial sync: 1,201 documents copied of 1,200 estimated, in \d+\.\d s "
        r"\(3 batches of up to 500\)",
        out,
    ), out
    assert (
        "During the copy, after its first batch, the demo inserted order 1201 (the copy "
        "read it too) and updated order 7 (already copied); after the copy the stream "
        "delivered 2 change events"
    ) in out
    assert (
        "Order table: 1,201 orders; the 1,200 pre-seeded orders equal their MongoDB documents ✓"
    ) in out
    updated_cents = existing_order(7)[2] + 10_000
    assert (
        "order 1201 inserted during the copy: in the mirror ✓; order 7 updated during the "
        f"copy: total_cents {updated_cents:,} in the mirror ✓"
    ) in out
    assert (
        "Workflow runs of the pre-seeded orders: 0 (on_snapshot only mirrors orders that "
        "predate the app); order 1201, a new order, has its run: 1"
    ) in out
    assert "✗" not in out
    expected = {order_id: existing_order(order_id) for order_id in range(1, 1201)}
    expected[7] = (*expected[7][:2], updated_cents)
    expected[1201] = ("c7", "new", 4_200)
    assert mirrored(sample_env, 1, 1201) == expected
    # The new orders, from 1202 on.
    assert re.search(r"second start: .*: 149 events handled", out), out
    assert "Order table: 1,320 orders; the new ones: 119 orders, 21 paid" in out
    assert (
        "Workflow 'order-approval': 122 runs started (one per new order); "
        "120 completed without approval, 2 waiting for approval"
    ) in out
    assert (
        "Why runs and orders differ: each of the 122 inserted orders started one run "
        "(keyed by its order id); 3 of them were deleted afterwards"
    ) in out
    assert "re-processed 0 of the 149 events" in out
    assert "workflow runs started by the restart: 0" in out
    assert (
        "delivered again (as after a crash before the checkpoint): no new run; runs for it: 1"
        in out
    )
    assert "approved by approver: run completed, order 1322 approval='approved'" in out
    # The large orders' approvals: a typed form, reminders and escalation to managers.
    assert (
        out.count(
            "its form: OrderDecisionForm; reminds every 12:00:00, escalates to 'managers' at "
        )
        == 2
    )
    assert (
        "approving $2,501.00: refused by the form (At most the order's total, $2500.00.)"
    ) in out
    assert "rejected by approver: run completed, order 1323 approval='rejected'" in out
    chain = re.findall(r"^  #(\d) \w{12}  (\S+)\s+(root|<- #\d)", out, re.MULTILINE)
    assert chain == [("1", "(seed)", "root"), ("2", "review", "<- #1"), ("3", "fulfil", "<- #2")]
    assert "[waited for approval" in out and "outcome='fulfilled', decided_by='approver'" in out
    assert "Decision: approved by approver at " in out
    assert "payload {'approved_amount': '2000.00', 'reason': 'credit_checked'}" in out
    assert "approved_cents=200000" in out
    assert "Audit: requested by system; approved by approver" in out
    # Payments: order 1324 on invoice terms waits for its payment; the payments stream
    # marks it paid and resumes the run, once.
    assert "Stream 'payments', first start: saves its position: 0 events handled" in out
    assert (
        "order 1324 ($125.00, invoice): run waiting_message, for a message on 'paid' "
        "(due in 14 days); order payment='due'"
    ) in out
    assert "payment pay-1324 written to shop.payments: 1 events handled" in out
    assert (
        "order 1324 payment='paid' ($125.00); run completed (payment='paid'), 1 message delivered"
    ) in out
    assert (
        "the payment delivered again (as after a checkpoint reset): messages to the run: 1" in out
    )
    for stream in ("orders", "inventory", "payments", "refunds"):
        assert stream in out
    assert "/admin/flowwarden_django/streamcheckpoint/" in out
    # The hints name this venv's python (or make targets), never a bare "python".
    executable = Path(sys.executable)
    python = executable.relative_to(ROOT) if executable.is_relative_to(ROOT) else executable
    assert f"{python} manage.py flowwarden_checkpoints show orders" in out
    assert "python manage.py" not in out.replace(f"{python} manage.py", "")
    shown = run("flowwarden_checkpoints", "show", "orders", env=sample_env)
    assert shown.returncode == 0, shown.stderr
    approvals = run("flowwarden_approvals", "list", "--status", "approved", env=sample_env)
    assert approvals.returncode == 0 and "order-approval" in approvals.stdout
    assert run("check", env=sample_env).returncode == 0


@pytest.mark.parametrize("runner", [[], ["--asyncio"]], ids=["threads", "asyncio"])
def test_run_burst_processes_the_events_then_resumes(sample_env, runner):
    """`flowwarden_streams run --burst` against a scripted server in this process: the
    first start copies the orders that exist (no events), then the inserts stream; on
    threads and, with ``--asyncio``, on one event loop with the async driver."""
    with ScriptedReplicaSet() as server:
        env = {**sample_env, "FLOWWARDEN_MONGO_URL": server.uri}
        existing = range(10_001, 10_151)
        server.seed(
            "shop",
            "orders",
            [
                dict(zip(FIELDS, existing_order(i), strict=True), _id=i, placed="2019-04-01")
                for i in existing
            ],
        )
        first = run("flowwarden_streams", "run", "--burst", *runner, env=env, timeout=120)
        assert first.returncode == 0, first.stderr
        assert "orders: 150 documents copied, 0 events handled, stopped" in first.stdout
        assert ("on one event loop (asyncio" in first.stdout) == bool(runner)
        assert mirrored(env, 10_001, 10_150) == {i: existing_order(i) for i in existing}
        for order_id in range(1, 251):
            server.insert("shop", "orders", {"_id": order_id, "status": "new"})
        second = run("flowwarden_streams", "run", "--burst", *runner, env=env, timeout=120)
        assert second.returncode == 0, second.stderr
        assert "orders: 250 events handled, stopped" in second.stdout
        third = run("flowwarden_streams", "run", "--burst", *runner, env=env, timeout=120)
        assert third.returncode == 0, third.stderr
        handled = int(re.search(r"orders: (\d+) events handled", third.stdout).group(1))
        assert handled <= 100 - 1, "at most save_every_n - 1 events are re-processed"
        status = run("flowwarden_streams", "status", env=env)
        assert status.returncode == 0 and "shop.orders" in status.stdout


def test_a_large_order_waits_with_a_form_and_escalation_and_withdrawing_it_cancels_it(
    sample_env,
):
    """The sample's human task and cancel: a large order waits for an approver, with
    a typed decision form (the order's total its initial amount and bound), reminders
    every 12 hours and escalation to ``managers`` after 24 (no reminder run of its
    own); the customer withdraws the order (its status becomes ``withdrawn`` in
    MongoDB) and the stream cancels its run and the pending approval."""
    with ScriptedReplicaSet() as server:
        env = {**sample_env, "FLOWWARDEN_MONGO_URL": server.uri}
        first = run("flowwarden_streams", "run", "--burst", env=env, timeout=120)
        assert first.returncode == 0, first.stderr
        order = {"_id": 501, "status": "new", "customer": "acme", "total_cents": 250_000}
        server.insert("shop", "orders", order)
        placed = run("flowwarden_streams", "run", "--burst", env=env, timeout=120)
        assert placed.returncode == 0, placed.stderr
        with sqlite3.connect(env["SAMPLEPROJECT_DB"]) as db:
            runs = dict(
                db.execute(
                    "SELECT idempotency_key, status FROM flowwarden_django_workflowrun "
                    "WHERE idempotency_key LIKE 'shop.%:501'"
                ).fetchall()
            )
            [(form, initial, group, to_group, remind, escalate, requested)] = db.execute(
                'SELECT a.form, a.form_initial, a."group", a.escalate_to_group, '
                "a.next_reminder_at, a.escalate_at, a.requested_at "
                "FROM flowwarden_django_approval a "
                "JOIN flowwarden_django_workflowrun r ON r.coordination_id = a.coordination_id "
                "WHERE r.idempotency_key = 'shop.orders:501'"
            ).fetchall()
        assert runs == {"shop.orders:501": "waiting"}  # no reminder run: remind_every
        assert form == "sampleproject.shop.forms.OrderDecisionForm"
        assert json.loads(initial) == {"approved_amount": "2500.00", "order_total": "2500.00"}
        assert (group, to_group) == ("approvers", "managers")
        since = datetime.fromisoformat(requested)
        assert datetime.fromisoformat(remind) - since == timedelta(hours=12)
        assert datetime.fromisoformat(escalate) - since == timedelta(hours=24)
        server.update("shop", "orders", 501, {"status": "withdrawn"})
        withdrawn = run("flowwarden_streams", "run", "--burst", env=env, timeout=120)
        assert withdrawn.returncode == 0, withdrawn.stderr
        with sqlite3.connect(env["SAMPLEPROJECT_DB"]) as db:
            runs = dict(
                db.execute(
                    "SELECT idempotency_key, status || ':' || failure_reason "
                    "FROM flowwarden_django_workflowrun "
                    "WHERE idempotency_key LIKE 'shop.%:501'"
                ).fetchall()
            )
            approvals = db.execute(
                "SELECT a.status FROM flowwarden_django_approval a "
                "JOIN flowwarden_django_workflowrun r ON r.coordination_id = a.coordination_id "
                "WHERE r.idempotency_key = 'shop.orders:501'"
            ).fetchall()
    assert runs == {"shop.orders:501": "cancelled:the order was withdrawn"}
    assert approvals == [("cancelled",)]


def test_a_payment_marks_its_order_paid_and_resumes_its_run_exactly_once(sample_env):
    """The sample's messages: an order on invoice terms is fulfilled and its run waits
    for its payment; the transactional ``payments`` stream marks the order paid and
    sends the run its message, which resumes it (``collect`` completes it with the
    payment). A payment for an order with no run is parked as a dead letter. The
    stream reset to its first position delivers the payments again: nothing is sent
    twice (the payment's ``_id`` is the message's idempotency key)."""
    with ScriptedReplicaSet() as server:
        env = {**sample_env, "FLOWWARDEN_MONGO_URL": server.uri}

        def burst():
            done = run("flowwarden_streams", "run", "--burst", env=env, timeout=120)
            assert done.returncode == 0, done.stderr
            return done.stdout

        burst()  # both streams save their first position
        shown = run("flowwarden_checkpoints", "show", "payments", "--json", env=env)
        assert shown.returncode == 0, shown.stderr
        first = json.loads(shown.stdout)["last_seen_token"]
        order = {"_id": 601, "customer": "initech", "total_cents": 12_500, "terms": "invoice"}
        server.insert("shop", "orders", {**order, "status": "new"})
        burst()
        assert query(env, RUN_OF_601) == [("waiting_message", "paid")]
        assert query(env, "SELECT payment FROM shop_order WHERE order_id = 601") == [("due",)]

        server.insert("shop", "payments", {"_id": "pay-1", "order_id": 601, "amount_cents": 12_500})
        server.insert("shop", "payments", {"_id": "pay-2", "order_id": 999, "amount_cents": 1})
        out = burst()
        assert "payments: 2 events handled" in out, out
        assert query(env, RUN_OF_601)[0][0] == "completed"
        assert query(env, "SELECT payment, paid_cents FROM shop_order WHERE order_id = 601") == [
            ("paid", 12_500)
        ]
        assert query(env, MESSAGES_OF_601) == [
            ("paid", '{"payment_id": "pay-1", "paid_cents": 12500}', "shop.payments", 1)
        ]
        parked = query(
            env,
            "SELECT error_type FROM flowwarden_django_deadletter WHERE stream_name = 'payments'",
        )
        assert parked == [("sampleproject.shop.workflows.PaymentForUnknownOrder",)]

        reset = run(
            "flowwarden_checkpoints",
            "reset",
            "payments",
            "--seen-token",
            json.dumps(first),
            "--yes",
            env=env,
        )
        assert reset.returncode == 0, reset.stderr
        again = burst()
        assert "payments: 2 events handled" in again, again
        assert len(query(env, MESSAGES_OF_601)) == 1, "a payment delivered again sent again"
        assert query(env, RUN_OF_601)[0][0] == "completed"


RUN_OF_601 = (
    "SELECT status, waiting_topic FROM flowwarden_django_workflowrun "
    "WHERE idempotency_key = 'shop.orders:601'"
)
MESSAGES_OF_601 = (
    "SELECT m.topic, m.payload, m.sender, m.delivered_to IS NOT NULL "
    "FROM flowwarden_django_workflowmessage m JOIN flowwarden_django_workflowrun r "
    "ON r.coordination_id = m.coordination_id WHERE r.idempotency_key = 'shop.orders:601'"
)


def query(env, sql):
    """The rows of *sql* in the sample's SQLite database."""
    with sqlite3.connect(env["SAMPLEPROJECT_DB"]) as db:
        return db.execute(sql).fetchall()
