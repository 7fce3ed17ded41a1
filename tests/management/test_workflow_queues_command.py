"""``manage.py flowwarden_workflows queues``: each queue's limits, slots in use,
waiting steps, oldest wait and recent starts (rows written straight to the tables, on
the SQLite default database)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from tests.support.queue_rows import held_slot, waiting_run

pytestmark = pytest.mark.django_db(transaction=True)

QUEUES = {
    "carrier-api": {"concurrency": 5, "worker_concurrency": 2, "rate": "100/m", "priority": True},
    "per-customer": {"concurrency": 1, "partitioned": True},
    "reports": {"concurrency": 2, "scope": "runs"},
    "bulk": {"worker_concurrency": 3},
}


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("flowwarden_workflows", "queues", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def rows() -> None:
    held_slot("carrier-api", 0)
    held_slot("carrier-api", 1)
    held_slot("carrier-api", 2, for_seconds=-1)  # free again
    for n in range(7):
        held_slot("carrier-api", n, kind="rate")
    waiting_run("c-1", "carrier-api", waited=125)
    waiting_run("c-2", "carrier-api", waited=3)
    held_slot("per-customer", 0, partition="cust-7")
    waiting_run("p-1", "per-customer", partition="cust-7", waited=42)
    waiting_run("p-2", "per-customer", partition="cust-9", waited=8)
    waiting_run("r-1", "retired", waited=900)


@override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": QUEUES, "WORKFLOW_QUEUE_STALE_AFTER": "1m"})
def test_lists_each_queue_and_each_partition_with_activity() -> None:
    rows()
    lines = run().splitlines()
    header = [cell.strip() for cell in lines[0].split("  ")]
    assert [cell for cell in header if cell] == [
        "QUEUE",
        "CONCURRENCY",
        "PER WORKER",
        "RATE",
        "OPTIONS",
        "SLOTS IN USE",
        "WAITING",
        "OLDEST WAIT",
        "RECENT STARTS",
    ]
    table = {
        line.split()[0] if not line.startswith("  ·") else line.split()[1]: line.split()
        for line in lines[1:8]
    }
    assert table["carrier-api"] == [
        "carrier-api",
        "5",
        "2",
        "100/m",
        "priority",
        "2/5",
        "2",
        "2m",
        "7/100",
    ]
    # A partitioned queue: the sums on its line, then each partition's against the limit.
    assert table["per-customer"] == [
        "per-customer",
        "1",
        "—",
        "—",
        "partitioned",
        "1",
        "2",
        "42s",
        "—",
    ]
    assert table["cust-7"] == ["·", "cust-7", "1/1", "1", "42s", "—"]
    assert table["cust-9"] == ["·", "cust-9", "0/1", "1", "8s", "—"]
    assert table["reports"] == ["reports", "2", "—", "—", "scope", "runs", "0/2", "0", "—", "—"]
    assert table["retired"][:6] == ["retired", "—", "—", "—", "not", "configured"]
    # Only a per-process limit: no concurrency slots to count.
    assert table["bulk"] == ["bulk", "—", "3", "—", "—", "—", "0", "—", "—"]
    text = "\n".join(lines)
    # The queue nothing admits, and the one whose oldest step waits too long.
    assert "1 run(s) wait for a slot of queue 'retired', which" in text
    assert "manage.py flowwarden_workflows cancel" in text
    assert "Queue 'carrier-api': its oldest waiting step has waited 2m, longer than" in text
    assert "'per-customer': its oldest" not in text


@override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": QUEUES, "WORKFLOW_QUEUE_STALE_AFTER": "1m"})
def test_json() -> None:
    rows()
    found = {queue["queue"]: queue for queue in json.loads(run("--json"))}
    assert list(found) == ["bulk", "carrier-api", "per-customer", "reports", "retired"]
    carrier = found["carrier-api"]
    assert carrier["concurrency"] == 5 and carrier["worker_concurrency"] == 2
    assert carrier["rate"] == "100/m" and carrier["priority"] is True
    assert (carrier["slots_in_use"], carrier["waiting"], carrier["recent_starts"]) == (2, 2, 7)
    assert 125 <= carrier["oldest_wait_seconds"] < 200 and carrier["stale"] is True
    assert carrier["partitions"] == []
    customers = found["per-customer"]
    assert customers["stale"] is False and customers["recent_starts"] is None
    assert [p["partition"] for p in customers["partitions"]] == ["cust-7", "cust-9"]
    assert customers["partitions"][0]["slots_in_use"] == 1
    assert found["retired"]["configured"] is False and found["retired"]["stale"] is True
    assert "concurrency" not in found["retired"]


@override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": {}})
def test_without_queues() -> None:
    assert "No workflow queues" in run()
    assert json.loads(run("--json")) == []


@override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": {"carrier-api": {"concurency": 5}}})
def test_a_bad_setting_says_to_run_the_check() -> None:
    with pytest.raises(CommandError, match=r"unknown option.*manage.py check"):
        run()


@override_settings(FLOWWARDEN={"WORKFLOW_QUEUES": QUEUES})
def test_database_alias() -> None:
    with pytest.raises(CommandError, match="DATABASES aliases"):
        run("--database", "nope")
    waiting_run("c-1", "carrier-api", waited=5)
    assert "carrier-api" in run("--database", "default")


def test_listed_in_the_help(capsys: Any) -> None:
    from flowwarden_django.management.commands.flowwarden_workflows import Command

    usage = Command().create_parser("manage.py", "flowwarden_workflows").format_help()
    assert "queues" in usage
