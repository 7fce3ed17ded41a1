"""Crash test: a transactional stream's handler sends messages to waiting runs, and the
consumer is SIGKILLed three times; every run completes with exactly one message.

Issue 47, item 5. Built like ``test_crash.py`` (read its module docstring): the
scripted MongoDB server (``tests/crash/server.py``, ``--events 200``) in one
subprocess, the consumer (``manage.py flowwarden_streams run --<runner> --stream
crash-sends`` with ``DJANGO_SETTINGS_MODULE=tests.crash.sends.settings``) in another,
everything in the PostgreSQL test database and checked from there.

**The runs.** Before the events arrive the test starts 200 runs of ``crash-paid``
(``tests/crash/sends/flows.py``), in this process: each one's first step returns
``wait_for(state, "paid")``, so all 200 wait for a message, holding nothing.

**The stream.** ``crash-sends`` (``tests/crash/sends/streams.py``) is
``transactional=True``; insert ``{_id: n, seq: n}`` is one order, and its handler
calls ``Workflow.for_coordination("crash-paid-<n>").send("paid", {"seq": n})`` with
no idempotency key: exactly once must come from the message committing with the
stream's processed anchor (or, in parallel, its settled mark). Once that commits the
consumer wakes the run in process (its ``took`` step runs on the stream's thread and
completes the run with the message's id). A third process, ``flowwarden_workflows
recover --every 250ms`` (the sweep of in-process deployments), continues what a kill
left behind: a run whose wake was lost, or whose step was cut short.

**Kills.** Three SIGKILLs while the events flow, each followed by a restart:

1. *Gated*, at a random order ``g1`` in 20..50: the handler, after sending for
   ``g1``, takes an advisory lock the test holds (``pg_advisory_xact_lock``), so it
   blocks with the message inserted and nothing committed; the test sees it waiting
   in ``pg_locks`` and kills it there: between the handler and its checkpoint.
2. *Free*, once 20-40 more messages committed, after a random 0-20 ms: anywhere in
   the handler / commit / wake / step cycle.
3. *Gated* again, at a random order in 140..180.

After a gated kill the test releases the gate's lock (the dead consumer's backend
waits for it, and only then reads from its client, finds it gone and rolls back).
After each kill it waits until PostgreSQL shows none of the dead consumer's sessions
and restarts the consumer. After the third restart it waits until every run
completed, then stops the consumer with SIGTERM (exit 0, the anchor at the last
event) and the sweeper.

**Checks, from the data.** Every run completed; each has exactly one
``WorkflowMessage``, with its order's payload, delivered once, to its waiting
snapshot (``delivered_to``), and the run's final state names that message; each run
has exactly its three snapshots (seed, ``wait``, ``took``). The message id sequence
shows the rolled-back sends: at least one per gated kill (the gated order's send was
inserted and never committed; at each gated kill its run had no message), and
200 + those is every id ever allocated. In parallel, no settled mark is left.

Modes: ``serial`` (one event at a time, every anchor written in its event's
transaction) and ``parallel`` (4 handler calls at once, orders keyed by ``seq % 8``,
the anchor the window's watermark every 25 events, each event's settled mark in its
transaction), each on ``threads`` and ``asyncio`` (``--threads`` / ``--asyncio``; on
asyncio a transactional attempt runs on the stream's thread). ``FLOWWARDEN_CRASH_SEED``
replays the gates and the free kill's point (not the timing). The counts are printed
even without ``-s`` and recorded as JUnit properties.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pymongo", reason="the crash test needs pymongo")
pytest.importorskip("mockupdb", reason="the scripted MongoDB server needs mockupdb==1.8.1")

from django.db import connections

from flowwarden_django.models import (
    SnapshotRecord,
    StreamSettledEvent,
    WorkflowMessage,
    WorkflowRun,
)
from flowwarden_django.streams.backends.orm import OrmCheckpointStore
from flowwarden_django.workflows import RunStatus, Workflow, WorkflowDefinition, workflow_registry
from flowwarden_django.workflows.definition.metadata import LAST_STEP
from tests.crash.sends import GATE_LOCK, SENDER, STREAM, WORKFLOW, coordination_id
from tests.crash.sends import flows as paid_flows
from tests.streams.test_crash import (
    CATCH_UP_TIMEOUT,
    PROGRESS_TIMEOUT,
    ROOT,
    START_TIMEOUT,
    STOP_TIMEOUT,
    Consumer,
    _consumer_sessions,
    _read_line,
    _stop,
    _wait_sessions_gone,
    _wait_until,
)
from tests.support.lanes import on_lane
from tests.support.story_procs import die_with_parent

#: Orders, runs and messages: one each per change event.
RUNS = 200
#: The gated kills' orders are drawn from these ranges; the free kill comes after the
#: first gate and 20-40 more messages, well before the second gate.
FIRST_GATE, SECOND_GATE = (20, 50), (140, 180)
FREE_KILL_GAP = (20, 40)
KILL_JITTER_SECONDS = 0.02
#: The sweeper's interval (``recover --every``).
EVERY = ("--every", "250ms")
#: The ``application_name`` of the sweeper's sessions (the consumer's is test_crash's).
SWEEPER_APPLICATION = "fw-crash-sweeper"


@dataclass(frozen=True)
class Kill:
    """What the data said right after one SIGKILL."""

    number: int
    kind: str  # "gated" (between the handler's send and its commit) or "free"
    messages: int  # committed messages
    rolled_back: int  # message ids allocated and never committed, so far
    running: int  # runs a step of which the kill cut short (continued by the sweeper)
    woken_lost: int  # runs with their message, still waiting (the wake was lost)
    gate_run_has_message: bool | None  # gated: whether the gated order's run has one
    marks: int  # parallel: events committed past the anchor (the restart skips them)


# -- the data ------------------------------------------------------------------------- #


def _messages() -> Any:
    return WorkflowMessage.objects.using("postgres").filter(
        coordination_id__startswith="crash-paid-"
    )


def _runs() -> Any:
    return WorkflowRun.objects.using("postgres").filter(workflow_name=WORKFLOW)


def _allocated_message_ids() -> int:
    """The last id the message table's sequence handed out (0 before the first)."""
    table = WorkflowMessage._meta.db_table
    with connections["postgres"].cursor() as cursor:
        cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table])
        sequence = cursor.fetchone()[0]
        cursor.execute(
            "SELECT last_value FROM pg_sequences WHERE schemaname || '.' || sequencename = %s",
            [sequence],
        )
        return cursor.fetchone()[0] or 0


def _waits_at_gate(seq: int) -> bool:
    """Whether a session waits for the gate's advisory lock of order *seq*."""
    with connections["postgres"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND classid = %s AND objid = %s AND objsubid = 2",
            [GATE_LOCK, seq],
        )
        return cursor.fetchone()[0] > 0


def _gate(action: str, seq: int) -> None:
    """Take (``lock``) or release (``unlock``) order *seq*'s gate in this session."""
    with connections["postgres"].cursor() as cursor:
        cursor.execute(f"SELECT pg_advisory_{action}(%s, %s)", [GATE_LOCK, seq])


# -- the processes -------------------------------------------------------------------- #


class Sweeper:
    """``manage.py flowwarden_workflows recover --every 250ms``: the recovery sweep of
    in-process runs, as a process manager would keep it running."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self.env = {
            **env,
            "FLOWWARDEN_CRASH_ROLE": "sweeper",
            "FLOWWARDEN_CRASH_APPLICATION": SWEEPER_APPLICATION,
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "flowwarden_workflows", "recover", *EVERY],
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    def assert_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(
                f"the sweeper exited (code {self.proc.returncode}):\n{self.tail()}"
            )

    def terminate(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=STOP_TIMEOUT)

    def close(self) -> None:
        _stop(self.proc)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no sweeper log)"


@pytest.fixture
def paid_workflow() -> Iterator[WorkflowDefinition]:
    """``crash-paid`` in this process, on the ``postgres`` alias (the processes define
    it on their ``default``, the same database)."""
    definition = paid_flows.define("postgres")
    yield definition
    workflow_registry.unregister(WORKFLOW)


# -- the test ------------------------------------------------------------------------- #


@pytest.mark.slow
@on_lane("postgres", databases=["default", "postgres"])
@pytest.mark.parametrize(
    ("mode", "runner"),
    [
        ("serial", "threads"),
        ("serial", "asyncio"),
        ("parallel", "threads"),
        ("parallel", "asyncio"),
    ],
)
def test_a_transactional_handler_sends_each_message_once_across_sigkills(
    mode, runner, paid_workflow, tmp_path, capsys, record_property
):
    """Three SIGKILLs (two between a send and its commit): 200 runs, 200 messages, each
    delivered once, every run completed."""
    seed = int(os.environ.get("FLOWWARDEN_CRASH_SEED") or random.randrange(2**32))
    rng = random.Random(seed)
    record_property("seed", seed)
    db = connections["postgres"].settings_dict
    store = OrmCheckpointStore(using="postgres")
    assert store.find(STREAM) is None

    for seq in range(1, RUNS + 1):
        paid_workflow.start({"seq": seq}, coordination_id=coordination_id(seq))
    waiting = _runs().filter(status=RunStatus.WAITING_MESSAGE, waiting_topic="paid").count()
    assert waiting == RUNS, f"{waiting} of {RUNS} runs wait for their message"
    gates = [rng.randint(*FIRST_GATE), rng.randint(*SECOND_GATE)]
    for seq in gates:
        _gate("lock", seq)
    allocated_before = _allocated_message_ids()

    server: subprocess.Popen[str] | None = None
    consumer: Consumer | None = None
    sweeper: Sweeper | None = None
    started = time.monotonic()
    server_log = (tmp_path / "server.log").open("w")
    try:
        server = subprocess.Popen(
            [sys.executable, "-m", "tests.crash.server", "--events", str(RUNS)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=server_log,
            text=True,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        ready = _read_line(server, START_TIMEOUT, "READY line")
        assert ready.startswith("READY mongodb://"), ready
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "tests.crash.sends.settings",
            "FLOWWARDEN_CRASH_MONGO_URL": ready.split()[1],
            "FLOWWARDEN_CRASH_DB_NAME": db["NAME"],
            "FLOWWARDEN_CRASH_DB_HOST": str(db["HOST"]),
            "FLOWWARDEN_CRASH_DB_PORT": str(db["PORT"]),
            "FLOWWARDEN_CRASH_DB_USER": str(db["USER"]),
            "FLOWWARDEN_CRASH_DB_PASSWORD": str(db["PASSWORD"]),
            "FLOWWARDEN_CRASH_MODE": mode,
            "FLOWWARDEN_CRASH_GATES": ",".join(map(str, gates)),
        }
        sweeper = Sweeper(env, tmp_path / "sweeper.log")
        sweeper.start()
        consumer = Consumer(
            {**env, "FLOWWARDEN_CRASH_ROLE": "consumer"},
            tmp_path / f"consumer-{mode}-{runner}.log",
            runner=runner,
            stream=STREAM,
        )

        def wait_alive(condition: Any, timeout: float, what: str) -> None:
            def holds() -> bool:
                sweeper.assert_alive()
                return condition()

            _wait_until(holds, timeout, what, consumer, server)

        consumer.start()
        wait_alive(lambda: store.find(STREAM) is not None, START_TIMEOUT, "the bootstrap position")
        server.send_signal(signal.SIGUSR1)
        fed = _read_line(server, START_TIMEOUT, "FED line").split()
        assert fed[0] == "FED", fed
        last_token = fed[2]

        kills: list[Kill] = []
        for number, kind in enumerate(("gated", "free", "gated"), 1):
            gate = gates[0] if number == 1 else gates[1]
            if kind == "gated":
                wait_alive(
                    lambda gate=gate: _waits_at_gate(gate),
                    PROGRESS_TIMEOUT,
                    f"the handler to block after sending for order {gate} (kill {number})",
                )
            else:
                target = max(_messages().count(), gates[0]) + rng.randint(*FREE_KILL_GAP)
                wait_alive(
                    lambda target=target: _messages().count() >= target,
                    PROGRESS_TIMEOUT,
                    f"{target} messages before kill {number}",
                )
                time.sleep(rng.uniform(0, KILL_JITTER_SECONDS))
            assert _consumer_sessions(db["NAME"]) >= 1, "the consumer has no visible session"
            consumer.kill()
            if kind == "gated":
                # Its backend waits for the lock and reads nothing from the dead client
                # until it has it: then it finds the client gone and rolls back.
                _gate("unlock", gate)
            _wait_sessions_gone(db["NAME"])
            messages = _messages()
            kill = Kill(
                number=number,
                kind=kind,
                messages=messages.count(),
                rolled_back=_allocated_message_ids() - allocated_before - messages.count(),
                running=_runs().filter(status=RunStatus.RUNNING).count(),
                woken_lost=_runs()
                .filter(status=RunStatus.WAITING_MESSAGE, pk__in=messages.values("coordination_id"))
                .count(),
                gate_run_has_message=(
                    messages.filter(coordination_id=coordination_id(gate)).exists()
                    if kind == "gated"
                    else None
                ),
                marks=StreamSettledEvent.objects.using("postgres")
                .filter(stream_name=STREAM)
                .count(),
            )
            kills.append(kill)
            assert kill.messages < RUNS, f"kill {number} did not land while events flowed: {kill}"
            if kind == "gated":
                assert kill.gate_run_has_message is False, (
                    f"kill {number}: order {gate}'s message committed before its checkpoint: {kill}"
                )
            consumer.start()

        wait_alive(
            lambda: _runs().filter(status=RunStatus.COMPLETED).count() >= RUNS,
            CATCH_UP_TIMEOUT,
            f"all {RUNS} runs to complete after the last restart",
        )
        assert consumer.terminate() == 0, consumer.log_tail()
        assert sweeper.terminate() == 0, sweeper.tail()
        saved = store.find(STREAM)
        duration = time.monotonic() - started
    finally:
        with connections["postgres"].cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock_all()")
        if consumer is not None:
            consumer.close()
        if sweeper is not None:
            sweeper.close()
        if server is not None:
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    server.wait(timeout=10)
            _stop(server)
        server_log.close()

    server_errors = (tmp_path / "server.log").read_text(errors="replace")
    assert "INTERNAL ERROR" not in server_errors, server_errors

    # -- checks, from the data ----------------------------------------------------------
    assert saved.last_processed_token["_data"] == last_token, "the anchor is not the last event"
    rows = list(_messages().order_by("id"))
    per_run = Counter(row.coordination_id for row in rows)
    cids = [coordination_id(seq) for seq in range(1, RUNS + 1)]
    doubled = {cid: n for cid, n in per_run.items() if n > 1}
    assert not doubled, f"{len(doubled)} runs got more than one message: {list(doubled)[:10]}"
    missing = sorted(set(cids) - set(per_run))
    assert not missing, f"{len(missing)} runs got no message, e.g. {missing[:10]}"
    assert len(rows) == RUNS

    snapshots = Counter(
        SnapshotRecord.objects.using("postgres")
        .filter(coordination_id__in=cids)
        .values_list("coordination_id", flat=True)
    )
    by: Counter[str] = Counter()
    for row in rows:
        seq = int(row.coordination_id.rsplit("-", 1)[1])
        assert (row.topic, row.payload, row.sender) == ("paid", {"seq": seq}, SENDER), row
        workflow = Workflow.for_coordination(row.coordination_id, using="postgres")
        assert workflow.status() == RunStatus.COMPLETED, row.coordination_id
        chain = workflow.history()
        assert snapshots[row.coordination_id] == len(chain) == 3, (
            f"run {row.coordination_id} has {snapshots[row.coordination_id]} snapshots"
        )
        [waited] = [s for s in chain if s.metadata.get(LAST_STEP) == "wait"]
        assert row.delivered_to == waited.id, f"message {row.pk} was not delivered to its wait"
        final = workflow.current_result().final_state
        assert (final["message"], final["payload"], final["sender"]) == (
            row.pk,
            row.payload,
            SENDER,
        )
        by[final["by"]] += 1

    rolled_back = _allocated_message_ids() - allocated_before - RUNS
    gated = sum(1 for kill in kills if kill.kind == "gated")
    assert rolled_back >= gated, (
        f"{rolled_back} sends rolled back, fewer than the {gated} gated kills: a gated send "
        "committed"
    )
    if mode == "parallel":
        assert not StreamSettledEvent.objects.using("postgres").filter(stream_name=STREAM), (
            "settled marks left after the graceful stop"
        )

    counts = {
        "mode": mode,
        "runner": runner,
        "runs": RUNS,
        "messages": len(rows),
        "kills": len(kills),
        "consumer_starts": consumer.starts,
        "sends_rolled_back": rolled_back,
        "completed_by_consumer": by["consumer"],
        "completed_by_sweeper": by["sweeper"],
        "seconds": round(duration, 1),
    }
    for key, value in counts.items():
        record_property(key, value)
    with capsys.disabled():
        print(
            f"\nmessage crash test [{mode}-{runner}]: runs={RUNS} messages={len(rows)} "
            f"kills={len(kills)} sends_rolled_back={rolled_back} completed by the consumer "
            f"{by['consumer']}, by the sweeper {by['sweeper']}, time={duration:.1f}s "
            f"gates={gates} seed={seed}"
        )
        print(
            "  per kill (kind: messages / rolled back / running / woken lost / settled marks): "
            + ", ".join(
                f"{k.kind}: {k.messages}/{k.rolled_back}/{k.running}/{k.woken_lost}/{k.marks}"
                for k in kills
            )
        )
