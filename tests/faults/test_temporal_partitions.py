"""A Temporal worker cut off from PostgreSQL (and from Temporal, or not) in the middle
of a step (issue 51).

The cut-off worker (``flowwarden_temporal_worker``) runs in a namespace of the test's
own and reaches both the PostgreSQL test database and the Temporal dev server (on the
host's loopback) through forwarders on the host end of a link. With the server: one
link carries both, so cutting it cuts the worker off from both, as a worker whose own
network fails is. Alone: PostgreSQL goes through a link of its own
(``namespace.add_link()``), and only that one is cut; the server stays reachable. A
second worker runs on the host, on the same task queue. Both use the libpq
parameters ``check --deploy`` asks for (W501) and, as every client the package opens,
gRPC keepalives within ``DEAD_CONNECTION_TIMEOUT``. The server runs with a keepalive
of its own (``SERVER_KEEPALIVE``): without it, the server keeps the cut-off worker's
pending polls for their whole minute and hands them tasks that vanish with them, each
lost for its timeout (10 s for a workflow task), and the run misses the 20 s bound.

While the cut-off worker's ``slow`` step runs (``fw-temporal-partitioned``), the link
is cut. Its step's claim is no longer renewed: once half the lease has passed without
a renewal, the step's heartbeat thread hands the attempt back to Temporal
(``integrations.temporal.handback``), to be retried just after the claim's lease
runs out; with the server cut off too, that fails, and its heartbeats no longer
reach the server: after the heartbeat timeout Temporal retries the activity. The
retry runs on the host's worker (the cut-off one refuses steps while its database is
silent), which meets the cut-off worker's claim until its lease runs out (nobody
renews it) and then runs the step, and the rest of the run (the healed worker may
run later steps too). The SDK may cancel the cut-off worker's attempt (its heartbeats
fail, or find the attempt gone); the step ignores that, as a step blocked in a call
that does not look at cancellation would, and ends only when the test releases it,
once the run has completed and the partition has lasted its length. Its late save is
then refused: by the fence (the activity logs "not saved, the run was taken over"),
or on the connection its keepalives declared dead. Nothing is written twice: one
snapshot per ``seq``; ``slow`` ran twice, every other step once; ``slow`` is
transactional, and its ``Effect`` row is committed once (the cut-off worker's rolled
back with its save). The cut-off worker then exits on SIGTERM within 10 s.

The 5 s partitions run under a 2 s heartbeat timeout and a 2 s claim lease, so that
they outlast both; the 60 s ones under flowwarden's defaults (10 s and 10 s).
"""

from __future__ import annotations

import itertools
import json
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("temporalio", reason="the Temporal tests need temporalio")

from django.db import connections
from django.test import override_settings

from flowwarden_django.common.network import postgres_options
from flowwarden_django.models import WorkflowRun
from flowwarden_django.workflows import RunStatus, Workflow, workflow_registry
from flowwarden_django.workflows.execution.providers import reset_providers
from tests.faults.figures import report
from tests.faults.takeover import partition_during_takeover
from tests.faults.worker_logs import first_notice, stamp_of
from tests.support import temporal_workflows as flows
from tests.support.lanes import lane_marks
from tests.support.polling import wait_until
from tests.support.services import SERVICES, temporal_binary
from tests.support.step_log import assert_chained, assert_committed_once, executions
from tests.support.temporal_procs import DevServer, TemporalWorker, worker_environment

DB = "postgres"
#: The run completes on the host within this many seconds of the cut (the issue's bound).
COMPLETION_BOUND = 20.0
#: The cut-off worker exits within this many seconds of SIGTERM after the healing.
EXIT_BOUND = 10.0
#: What the cut-off worker's log says of its late save (``activities._run_step``).
FENCED = "not saved, the run was taken over"

#: The server's own keepalive (its frontend pings a connection silent this long, and
#: closes it when the ping is not answered in time): a cut-off worker's pending polls
#: end with its connection, else the server hands them tasks that are lost with them.
SERVER_KEEPALIVE = {"frontend.keepAliveTime": "5s", "frontend.keepAliveTimeout": "5s"}

pytestmark = [
    *lane_marks("postgres", databases=["default", DB]),
    pytest.mark.lane("temporal"),
    pytest.mark.faults,
    pytest.mark.subprocess,
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    if temporal_binary() is None:
        pytest.skip("no temporal binary")  # the lane mark reports the reason first
    dev = DevServer(tmp_path_factory.mktemp("temporal"), dynamic_config=SERVER_KEEPALIVE)
    dev.start()
    yield dev
    dev.stop()


@pytest.fixture
def definition() -> Iterator[Any]:
    defined = flows.define_workflows(DB)
    yield defined[flows.PARTITIONED]
    for name in defined:
        workflow_registry.unregister(name)


def _state_of(cid: str) -> tuple[str, bool]:
    """Run *cid*'s runner, and whether it has completed."""
    run = WorkflowRun.objects.using(DB).get(pk=cid)
    return run.runner, run.status == RunStatus.COMPLETED


def _when(condition: Any, what: str, timeout: float) -> float:
    """Poll *condition* until it holds; the ``time.monotonic()`` when it did."""
    wait_until(condition, what, timeout=max(timeout, 0.0), interval=0.05)
    return time.monotonic()


def _late_save(worker: TemporalWorker) -> str | None:
    """How the cut-off worker's late save (of the slow step's first attempt) ended,
    once its log says so: refused by the fence, or failed on a dead connection (the
    SDK reports the attempt failed, with the error's traceback)."""
    lines = worker.log().splitlines()
    for index, line in enumerate(lines):
        if FENCED in line and "step attempt 1 " in line:
            return "fenced"
        if "Completing activity as failed" in line and "'attempt': 1," in line:
            trace = itertools.takewhile(lambda text: stamp_of(text) is None, lines[index + 1 :])
            error = [text for text in trace if text and not text[0].isspace()][-1:]
            if error and "OperationalError" in error[0]:
                return "refused on a dead connection"
            return f"failed ({error[0][:160] if error else line[:160]})"
    return None


SHORT = ({"FLOWWARDEN_TEMPORAL_RUN_LEASE": "2s"}, {"HEARTBEAT_TIMEOUT": "2s"})
DEFAULTS = ({"FLOWWARDEN_TEMPORAL_DEFAULTS": "1"}, {})


@pytest.mark.parametrize(
    ("partition", "env", "temporal", "alone"),
    [
        pytest.param(5.0, *SHORT, False, id="5s"),
        pytest.param(60.0, *DEFAULTS, False, id="60s", marks=pytest.mark.slow),
        pytest.param(5.0, *SHORT, True, id="5s-postgres-alone"),
        pytest.param(60.0, *DEFAULTS, True, id="60s-postgres-alone", marks=pytest.mark.slow),
    ],
)
def test_a_temporal_worker_cut_off_mid_step_is_replaced_and_its_late_save_refused(
    namespace,
    server,
    definition,
    tmp_path: Path,
    partition: float,
    env: dict[str, str],
    temporal: dict[str, str],
    alone: bool,
):
    queue = f"fw-partition-{uuid.uuid4().hex[:8]}"
    state = {
        "log": str(tmp_path / "steps.log"),
        "release": str(tmp_path / "release"),
        "sleep": 0.5,
        "trail": [],
    }
    database = connections[DB].settings_dict
    pg = SERVICES["postgres"]
    # Alone: PostgreSQL through a link of its own, cut; Temporal through the first one.
    cut_off = namespace.add_link() if alone else namespace
    pg_forwarder = cut_off.forward(pg.port, pg.host)
    temporal_forwarder = namespace.forward(server.port)
    common = {**env, "FLOWWARDEN_TEMPORAL_DB_OPTIONS": json.dumps(postgres_options())}
    inside_env = {
        **worker_environment(
            f"{temporal_forwarder.host}:{temporal_forwarder.port}",
            queue,
            {**database, "HOST": pg_forwarder.host, "PORT": pg_forwarder.port},
        ),
        **common,
    }
    host_env = {**worker_environment(server.target, queue, database), **common}
    setting = {
        "WORKFLOW_EXECUTION": "temporal",
        "TEMPORAL": {"TARGET": server.target, "TASK_QUEUE": queue, **temporal},
    }
    inside = TemporalWorker(
        inside_env, tmp_path / "inside.log", name="the cut-off worker", wrap=namespace.command
    )
    host: TemporalWorker | None = None
    try:
        with override_settings(FLOWWARDEN=setting):
            reset_providers()
            cid = definition.start(state).coordination_id
        wait_until(
            lambda: any(e["step"] == "slow" for e in executions(state["log"])),
            "the slow step's start on the cut-off worker",
            timeout=60,
        )
        host = TemporalWorker(host_env, tmp_path / "host.log", name="the host's worker")
        cut_wall = time.time()
        took = partition_during_takeover(
            cut_off,
            lambda: _state_of(cid),
            partition=partition,
            bound=COMPLETION_BOUND,
        )
        open(state["release"], "w").close()  # the cut-off worker's step ends now
        released_at = time.monotonic()
        refused_at = _when(lambda: _late_save(inside) is not None, "the late save", 60)
        outcome = _late_save(inside)
        code = inside.stop(timeout=EXIT_BOUND)
        exited_at = time.monotonic()
    except BaseException:
        described = [inside.describe(60), host.describe(60) if host else "", server.describe()]
        print("\n".join(described), file=sys.stderr)
        raise
    finally:
        reset_providers()
        inside.stop(timeout=0)
        if host is not None:
            host.stop()
        # Its connections end: a transaction the cut-off worker left open rolls back.
        pg_forwarder.stop()
    cut = took.cut_at
    report(
        f"[faults] Temporal worker cut off from {CUT_OFF_FROM[alone]} for "
        f"{took.healed_at - cut:.0f} s mid-step ({_settings_of(env)}): it noticed "
        f"{first_notice(inside.log(), cut_wall, NOTICES)} after the cut; the host's worker took "
        f"the run over {took.taken_over_at - cut:.1f} s after the cut and completed it "
        f"{took.done_at - cut:.1f} s after it; the step released once the run had completed "
        f"and the link healed, its late save was {outcome} {refused_at - released_at:.1f} s "
        f"after; SIGTERM exit {exited_at - refused_at:.1f} s after that"
    )
    if partition < 30:  # shorter than the keepalives' bound: the connection survives
        assert outcome == "fenced", inside.log()[-3000:]
    assert code is not None, "the cut-off worker did not exit on SIGTERM"
    counts = Counter(e["step"] for e in executions(state["log"]))
    assert counts == {"one": 1, "slow": 2, "three": 1, "four": 1}
    assert_chained(Workflow.for_coordination(cid, using=DB), ["one", "slow", "three", "four"])
    # The transactional slow step's effect: the host's worker's execution's row, once.
    assert_committed_once(cid, "slow", state["log"], DB, execution=2)


#: What the cut-off worker logs when it notices the partition: it hands the step back
#: (its claim lapsed), the SDK cancels a step whose heartbeats fail (the test's step
#: says so), the gRPC keepalive closes the connection, a claim renewal times out.
NOTICES = (
    "handed back to Temporal",
    "cancelled by the SDK",
    "KeepAliveTimedOut",
    "renewing run claims failed",
)
#: What the worker is cut off from, in the report: alone, or not.
CUT_OFF_FROM = {
    False: "PostgreSQL and Temporal",
    True: "PostgreSQL alone (Temporal reachable)",
}


def _settings_of(env: dict[str, str]) -> str:
    if env.get("FLOWWARDEN_TEMPORAL_DEFAULTS") == "1":
        return "heartbeat timeout 10 s, lease 10 s"
    return f"heartbeat timeout 2 s, lease {env['FLOWWARDEN_TEMPORAL_RUN_LEASE']}"
