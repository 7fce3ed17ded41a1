"""An in-process runner cut off from PostgreSQL in the middle of a step (issue 51).

The runner (``tests.faults.partitioned_workflow start``) runs in a namespace of the
test's own and reaches the PostgreSQL test database through a forwarder on the host
end of the link; a live sweeper (``... sweep``: ``flowwarden_workflows recover
--every``) runs on the host. Both use the libpq parameters ``check --deploy`` asks for
(W501: keepalives and ``tcp_user_timeout`` within ``DEAD_CONNECTION_TIMEOUT``).

While the runner's ``slow`` step runs, the link is cut: silently, as a dropped switch
port does. The runner's claim runs out; the sweeper takes the run over and completes
it on the host. The link heals once the partition has lasted its length (and the run
was taken over); then the cut-off runner's step ends and its late save is refused:
by the fence (``ConcurrentRunError``) when its connection survived (the 5 s
partition), or on the connection its keepalives declared dead during the 60 s one
(``OperationalError``: the engine does not reconnect to save). Either way nothing is
written: one snapshot per ``seq``, the slow step ran twice (once per runner), every
other step once, and the slow step, transactional, committed its ``Effect`` row once:
the cut-off runner's was rolled back with its save. The cut-off process then exits on SIGTERM.

The 5 s partition runs under a 2 s claim lease (and ``WORKFLOW_RECOVER_AFTER``), so
that it outlasts the lease; the 60 s one under the defaults (10 s).
"""

from __future__ import annotations

import json
import signal
import sys
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from django.db import connections

from flowwarden_django.common.network import postgres_options
from flowwarden_django.models import WorkflowRun
from flowwarden_django.workflows import RunStatus, workflow_registry
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore
from tests.faults import partitioned_workflow
from tests.faults.figures import report
from tests.faults.processes import WorkflowProcess, database_env
from tests.support.lanes import lane_marks
from tests.support.polling import wait_until
from tests.support.services import SERVICES
from tests.support.step_log import assert_chained, assert_committed_once, executions

DB = "postgres"
#: The run completes on the host within this many seconds of the cut (the issue's bound).
COMPLETION_BOUND = 20.0
#: The cut-off runner exits within this many seconds of SIGTERM after the healing.
EXIT_BOUND = 10.0

pytestmark = [
    *lane_marks("postgres", databases=["default", DB]),
    pytest.mark.faults,
    pytest.mark.subprocess,
]


@pytest.fixture
def definition() -> Any:
    defined = partitioned_workflow.define(OrmSnapshotStore(using=DB), using=DB)
    yield defined
    workflow_registry.unregister(partitioned_workflow.WORKFLOW)


def _run(cid: str) -> WorkflowRun | None:
    return WorkflowRun.objects.using(DB).filter(pk=cid).first()


@pytest.mark.parametrize(
    ("partition", "settings"),
    [
        pytest.param(5.0, {"WORKFLOW_RUN_LEASE": "2s", "WORKFLOW_RECOVER_AFTER": "2s"}, id="5s"),
        pytest.param(60.0, {}, id="60s", marks=pytest.mark.slow),
    ],
)
def test_a_runner_cut_off_mid_step_is_taken_over_and_its_late_save_refused(
    namespace, definition, tmp_path, partition, settings
):
    cid = f"partitioned-{uuid.uuid4().hex[:8]}"
    state = {
        "log": str(tmp_path / "steps.log"),
        "release": str(tmp_path / "release"),
        "sleep": 0.5,
        "trail": [],
    }
    db = connections[DB].settings_dict
    common = {
        "FW_WF_DB_OPTIONS": json.dumps(postgres_options()),
        "FW_WF_FLOWWARDEN": json.dumps(settings),
    }
    server = SERVICES["postgres"]
    forwarder = namespace.forward(server.port, server.host)
    sweeper = WorkflowProcess(
        ["sweep"], {**common, **database_env(db, server.host, server.port)}, tmp_path / "sweep"
    )
    runner = WorkflowProcess(
        ["start", cid, json.dumps(state)],
        {**common, **database_env(db, forwarder.host, forwarder.port)},
        tmp_path / "runner",
        wrap=namespace.command,
    )
    try:
        sweeper.wait_for_line("Sweeping for stalled runs")
        wait_until(
            lambda: any(e["step"] == "slow" for e in executions(state["log"])),
            "the slow step's start",
            timeout=60,
        )
        original = _run(cid).runner
        cut_wall = time.time()
        cut_at = namespace.cut()
        taken_over_at = _when(lambda: _run(cid).runner not in ("", original), "the takeover", 60)
        done_at = _when(
            lambda: _run(cid).status == RunStatus.COMPLETED,
            "the run's completion on the host",
            COMPLETION_BOUND - (time.monotonic() - cut_at),
        )
        time.sleep(max(0.0, cut_at + partition - time.monotonic()))  # the partition itself
        healed_at = namespace.heal()
        open(state["release"], "w").close()  # the cut-off runner's step ends now
        outcome = wait_until(
            lambda: runner.event("fenced", "result", "error"),
            "the cut-off runner's late commit",
            timeout=60,
        )
        code = runner.stop(signal.SIGTERM, timeout=EXIT_BOUND)
        exited_at = time.monotonic()
    except BaseException:
        print(f"runner:\n{runner.describe()}\nsweeper:\n{sweeper.describe()}", file=sys.stderr)
        raise
    finally:
        runner.stop(signal.SIGKILL)
        sweeper.stop()
        # Its connections end: a transaction the cut-off runner left open rolls back.
        forwarder.stop()
    noticed = [e for e in runner.events() if e["event"] == "log" and e["t"] >= cut_wall]
    noticed_after = (
        f"{noticed[0]['t'] - cut_wall:.1f} s ({noticed[0]['message'][:120]!r})"
        if noticed
        else "never"
    )
    report(
        f"[faults] in-process runner cut off from PostgreSQL for {healed_at - cut_at:.0f} s "
        f"mid-step (lease {settings.get('WORKFLOW_RUN_LEASE', '10s')}): the runner noticed "
        f"{noticed_after} after the cut; the sweeper took over {taken_over_at - cut_at:.1f} s "
        f"after it and completed the run {done_at - cut_at:.1f} s after it; the late commit "
        f"was {outcome['event']} {outcome['t'] - cut_wall - (healed_at - cut_at):.1f} s after "
        f"healing {outcome.get('message', '')[:80]!r}; SIGTERM exit "
        f"{exited_at - healed_at:.1f} s after healing"
    )
    if partition < 30:  # shorter than the keepalives' bound: the connection survives
        assert outcome["event"] == "fenced", outcome
    else:
        assert outcome["event"] == "fenced" or _declared_dead(outcome), outcome
    assert code is not None, "the cut-off runner did not exit on SIGTERM"
    counts = Counter(e["step"] for e in executions(state["log"]))
    assert counts == {"one": 1, "slow": 2, "three": 1, "four": 1}
    assert_chained(definition.workflow(cid), list(partitioned_workflow.STEPS))
    # The transactional slow step's effect: the sweeper's execution's row, once.
    assert_committed_once(cid, "slow", state["log"], DB, execution=2)
    assert _run(cid).attempts >= 1


def _declared_dead(outcome: dict[str, Any]) -> bool:
    """The late save failed on a connection the keepalives declared dead during the
    partition (so nothing reached the database: the fence was not even needed)."""
    return outcome["event"] == "error" and outcome["error"] == "OperationalError"


def _when(condition: Any, what: str, timeout: float) -> float:
    """Poll *condition* until it holds; the ``time.monotonic()`` when it did."""
    wait_until(condition, what, timeout=max(timeout, 0.0), interval=0.05)
    return time.monotonic()
