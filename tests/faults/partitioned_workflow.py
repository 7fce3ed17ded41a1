"""The workflow of the partition tests and its processes:
``python -m tests.faults.partitioned_workflow start <cid> <json state>`` (a runner)
or ``... sweep`` (``flowwarden_workflows recover --every``), against the PostgreSQL
database the environment names (as ``tests.support.workflow_procs``:
``FW_WF_DB_NAME``, ``_HOST``, ``_PORT``, ``_USER``, ``_PASSWORD``), with
``FW_WF_DB_OPTIONS`` (JSON: the libpq parameters) and ``FW_WF_FLOWWARDEN`` (JSON:
settings merged into ``FLOWWARDEN``).

``wf-partitioned`` has four steps, each logged to ``state["log"]``
(``tests.support.step_log``). The second, ``slow``, on its first execution waits
until the file ``state["release"]`` exists (the test creates it once the link is
healed, so the cut-off runner's commit comes after the healing); executed again (by
the runner that took the run over), it sleeps ``state["sleep"]`` seconds. ``slow`` is
transactional (``@step(transactional=True)``): before anything else, each execution
writes one ``Effect`` row (``stream``: ``"<cid>:slow:<pid>"``, ``order_id``: the
execution's number) in the runs' database, committed with the step's snapshot, so the
cut-off runner's row is rolled back with its refused save (``step_log.write_effect``).

The runner prints JSON lines: ``started``; ``log`` for each warning the package logs
(``t``: ``time.time()``), which is how the test sees the runner notice the partition;
then ``result``, ``fenced`` (``ConcurrentRunError``: its late commit was refused) or
``error`` (any other exception's class and text).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

WORKFLOW = "wf-partitioned"
STEPS = ("one", "slow", "three", "four")


def define(store: Any, using: str | None = None) -> Any:
    """Register ``wf-partitioned`` on *store*; its definition."""
    from flowwarden_django.workflows import Workflow, advance, step
    from tests.support.step_log import record, then, write_effect

    def logged_step(name: str) -> Any:
        @step(name, transactional=name == "slow")
        def run_step(state: dict[str, Any], ctx: Any) -> Any:
            if name == "slow":  # in the step's transaction, before the test sees it start
                write_effect(state, ctx, using)
            executions = record(state, ctx)
            if name == "slow" and executions == 1:
                while not Path(state["release"]).exists():
                    time.sleep(0.05)
            elif name == "slow":
                time.sleep(state["sleep"])
            return advance(then(state, name))

        return run_step

    return Workflow.define(WORKFLOW, [logged_step(n) for n in STEPS], store, using=using)


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}, default=str), flush=True)


class _EmitWarnings(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        _emit("log", logger=record.name, message=record.getMessage())


def _configure() -> None:
    from tests.support.line_processes import configure_process

    configure_process(
        {
            "INSTANCE_ID": f"proc-{os.getpid()}",
            **json.loads(os.environ.get("FW_WF_FLOWWARDEN", "{}")),
        }
    )
    handler = _EmitWarnings(logging.WARNING)
    logging.getLogger("flowwarden_django").addHandler(handler)


def main(argv: list[str]) -> int:
    _configure()
    from django.core.management import call_command

    from flowwarden_django.workflows import ConcurrentRunError, snapshot_stores

    definition = define(snapshot_stores["default"])
    if argv[0] == "sweep":
        call_command("flowwarden_workflows", "recover", "--every")
        return 0
    cid, state = argv[1], json.loads(argv[2])
    _emit("started", pid=os.getpid())
    try:
        result = definition.workflow(cid).run(state)
    except ConcurrentRunError as exc:
        _emit("fenced", error=type(exc).__name__, message=str(exc))
        return 0
    except Exception as exc:
        _emit("error", error=type(exc).__name__, message=str(exc))
        return 1
    _emit("result", kind=type(result).__name__, status=result.status)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
