"""README command 1 and the sample's stream: they run on SQLite with no servers."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flowwarden_django.testkit.scripted_mongo import ScriptedReplicaSet

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


@pytest.fixture
def sample_env(tmp_path):
    env = {**os.environ, "SAMPLEPROJECT_DB": str(tmp_path / "demo.sqlite3")}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("FLOWWARDEN_MONGO_URL", None)
    migrated = run("migrate", "--noinput", "-v", "0", env=env)
    assert migrated.returncode == 0, migrated.stderr
    return env


def test_demo_runs_the_whole_story(sample_env):
    """README command 1: the stream, the workflows it starts once per order, two
    approvals decided, the snapshot chain and the decision printed."""
    for _ in range(2):  # a second run works on the existing data
        result = run("demo", "--orders", "120", env=sample_env)
        assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "scripted replica set" in out
    assert "first start" in out and ": 0 events handled" in out
    assert re.search(r"second start: .*: 149 events handled", out), out
    assert "Order table: 119 orders, 21 paid" in out
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
    assert "approved by approver: run completed, order 121 approval='approved'" in out
    assert "rejected by approver: run completed, order 122 approval='rejected'" in out
    chain = re.findall(r"^  #(\d) \w{12}  (\S+)\s+(root|<- #\d)", out, re.MULTILINE)
    assert chain == [("1", "(seed)", "root"), ("2", "review", "<- #1"), ("3", "fulfil", "<- #2")]
    assert "[waited for approval" in out and "outcome='fulfilled', decided_by='approver'" in out
    assert "Decision: approved by approver at " in out and "{'ship': 'express'}" in out
    assert "Audit: requested by system; approved by approver" in out
    for stream in ("orders", "inventory", "payments"):
        assert stream in out
    assert "/admin/flowwarden_django/streamcheckpoint/" in out
    # The hints name this venv's python (or make targets), never a bare "python".
    python = os.path.relpath(sys.executable, ROOT)
    assert f"{python} manage.py flowwarden_checkpoints show orders" in out
    assert "python manage.py" not in out.replace(f"{python} manage.py", "")
    shown = run("flowwarden_checkpoints", "show", "orders", env=sample_env)
    assert shown.returncode == 0, shown.stderr
    approvals = run("flowwarden_approvals", "list", "--status", "approved", env=sample_env)
    assert approvals.returncode == 0 and "order-approval" in approvals.stdout
    assert run("check", env=sample_env).returncode == 0


def test_run_burst_processes_the_events_then_resumes(sample_env):
    """`flowwarden_streams run --burst` against a scripted server in this process."""
    with ScriptedReplicaSet() as server:
        env = {**sample_env, "FLOWWARDEN_MONGO_URL": server.uri}
        first = run("flowwarden_streams", "run", "--burst", env=env, timeout=120)
        assert first.returncode == 0, first.stderr
        assert "orders: 0 events handled, stopped" in first.stdout
        for order_id in range(1, 251):
            server.insert("shop", "orders", {"_id": order_id, "status": "new"})
        second = run("flowwarden_streams", "run", "--burst", env=env, timeout=120)
        assert second.returncode == 0, second.stderr
        assert "orders: 250 events handled, stopped" in second.stdout
        third = run("flowwarden_streams", "run", "--burst", env=env, timeout=120)
        assert third.returncode == 0, third.stderr
        handled = int(re.search(r"orders: (\d+) events handled", third.stdout).group(1))
        assert handled <= 100 - 1, "at most save_every_n - 1 events are re-processed"
        status = run("flowwarden_streams", "status", env=env)
        assert status.returncode == 0 and "shop.orders" in status.stdout
