"""Workflows shared by the workflow tests and their subprocesses.

The tests import the definitions; ``python -m tests.support.workflow_procs <action> ...`` runs
one action in a fresh process against the test database named by the environment
(``FW_WF_DB_ENGINE`` = ``postgresql`` or ``sqlite3``, ``FW_WF_DB_NAME``, and for
PostgreSQL ``FW_WF_DB_HOST`` / ``_PORT`` / ``_USER`` / ``_PASSWORD``), with the ORM
snapshot store on it. Actions (each prints one JSON line per event on stdout):

* ``resume <coordination_id> <json input>``: ``Workflow.for_coordination(cid)
  .resume(input)``, prints the result.
* ``start <workflow> <coordination_id> <json state>``: runs the workflow in this
  process (the in-process provider), prints the result.
* ``sweep``: ``manage.py flowwarden_workflows recover --every`` (the default
  interval) until SIGTERM: the in-process sweep, as the README sets it up.
* ``race <coordination_id>``: prints ``ready``, waits for ``go`` on stdin, then runs
  the ``race`` workflow; if this process wins, its first step prints ``in-step`` and
  waits for ``continue`` on stdin. Prints the result, or ``concurrent`` with the
  error message when the other process holds the run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

APPROVAL = "wf-approval"
RACE = "wf-race"
RACE_STEPS = ("one", "two", "three")
#: Four steps, the second sleeping ``state["sleep"]`` seconds each time it runs; every
#: execution is logged to ``state["log"]`` (``tests.support.step_log``).
SLOW_SECOND = "wf-slow-second"
SLOW_SECOND_STEPS = ("one", "slow", "three", "four")
#: Spawns five ``wf-fan-child`` runs (``n`` = 1..5) and sums what they return; a
#: child whose ``n`` is ``state["stall"]`` sleeps 300 s on its first execution (a
#: test kills the process there: after the spawn committed, mid-way through the
#: children). Every execution is logged to ``state["log"]``.
#: ``one``, a sleep of ``state["nap"]`` seconds, ``three``; every execution logged.
NAPPER = "wf-napper"
FAN_OUT = "wf-fan-out"
FAN_CHILD = "wf-fan-child"

#: Called by the race workflow's first step (the subprocess blocks there).
on_race_step_one: Callable[[], None] | None = None
#: The database alias the steps' ``Effect`` rows go to (tests set it).
effect_using = "default"


def _effect(ctx: Any, order_id: int = 0) -> None:
    from tests.testapp.models import Effect

    Effect.objects.using(effect_using).create(order_id=order_id, stream=ctx.idempotency_key)


def define_workflows(store: Any, using: str | None = None) -> dict[str, Any]:
    """Register the shared workflows on *store*; return their definitions by name."""
    from flowwarden_django.workflows import (
        Workflow,
        advance,
        done,
        hibernate,
        sleep,
        spawn,
        step,
    )

    @step("prepare")
    def prepare(state: dict[str, Any], ctx: Any) -> Any:
        _effect(ctx)
        return advance({**state, "prepared": True})

    @step("ask")
    def ask(state: dict[str, Any]) -> Any:
        return hibernate({**state, "asked": True})

    @step("decide")
    def decide(state: dict[str, Any], ctx: Any) -> Any:
        _effect(ctx)
        return done({**state, "decision": ctx.input, "pid": os.getpid()})

    def race_step(name: str) -> Any:
        @step(name)
        def run_step(state: dict[str, Any], ctx: Any) -> Any:
            if name == "one" and on_race_step_one is not None:
                on_race_step_one()
            _effect(ctx, os.getpid())
            return advance({**state, "trail": [*state.get("trail", []), name]})

        return run_step

    def logged_step(name: str) -> Any:
        @step(name)
        def run_step(state: dict[str, Any], ctx: Any) -> Any:
            from tests.support.step_log import record, then

            record(state, ctx)
            if name == "slow":
                time.sleep(state["sleep"])
            return advance(then(state, name))

        return run_step

    slow_second = [logged_step(name) for name in SLOW_SECOND_STEPS]

    @step("fan_out")
    def fan_out(state: dict[str, Any], ctx: Any) -> Any:
        from tests.support.step_log import record

        record(state, ctx)
        children = [
            (FAN_CHILD, {"n": n, "log": state["log"], "stall": state.get("stall")})
            for n in range(1, 6)
        ]
        return spawn(state, children, then="results")

    @step("collect")
    def collect(state: dict[str, Any], ctx: Any) -> Any:
        from tests.support.step_log import record

        record(state, ctx, children=len(ctx.children))
        return done({**state, "total": sum(r["state"]["value"] for r in state["results"])})

    @step("enrich")
    def enrich(state: dict[str, Any], ctx: Any) -> Any:
        from tests.support.step_log import record

        if record(state, ctx, n=state["n"]) == 1 and state["n"] == state.get("stall"):
            time.sleep(300)
        return advance({**state, "value": state["n"] * 10})

    @step("nap")
    def nap(state: dict[str, Any], ctx: Any) -> Any:
        from tests.support.step_log import record, then

        record(state, ctx)
        return sleep(then(state, "nap"), state["nap"])

    return {
        NAPPER: Workflow.define(
            NAPPER, [logged_step("one"), nap, logged_step("three")], store, using=using
        ),
        FAN_CHILD: Workflow.define(FAN_CHILD, [enrich], store, using=using),
        FAN_OUT: Workflow.define(FAN_OUT, [fan_out, collect], store, using=using),
        APPROVAL: Workflow.define(APPROVAL, [prepare, ask, decide], store, using=using),
        RACE: Workflow.define(RACE, [race_step(n) for n in RACE_STEPS], store, using=using),
        SLOW_SECOND: Workflow.define(SLOW_SECOND, slow_second, store, using=using),
    }


def _configure() -> None:
    import django
    from django.conf import settings

    engine = os.environ["FW_WF_DB_ENGINE"]
    database: dict[str, Any] = {
        "ENGINE": f"django.db.backends.{engine}",
        "NAME": os.environ["FW_WF_DB_NAME"],
    }
    if engine == "postgresql":
        database.update(
            HOST=os.environ.get("FW_WF_DB_HOST", "127.0.0.1"),
            PORT=os.environ.get("FW_WF_DB_PORT", "5432"),
            USER=os.environ.get("FW_WF_DB_USER", "postgres"),
            PASSWORD=os.environ.get("FW_WF_DB_PASSWORD", ""),
        )
    else:
        database["OPTIONS"] = {"timeout": 30}
    settings.configure(
        SECRET_KEY="tests-only-not-secret",
        USE_TZ=True,
        TIME_ZONE="UTC",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        INSTALLED_APPS=["django.contrib.contenttypes", "flowwarden_django", "tests.testapp"],
        DATABASES={"default": database},
        FLOWWARDEN={"INSTANCE_ID": f"proc-{os.getpid()}"},
    )
    django.setup()


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}, default=str), flush=True)


def _result_fields(result: Any) -> dict[str, Any]:
    return {"kind": type(result).__name__, **result.__dict__, "status": result.status}


def main(argv: list[str]) -> int:
    global on_race_step_one
    _configure()
    from flowwarden_django.workflows import (
        ConcurrentRunError,
        Workflow,
        snapshot_stores,
        workflow_registry,
    )

    define_workflows(snapshot_stores["default"])
    if argv[0] == "start":
        name, cid, state = argv[1], argv[2], json.loads(argv[3])
        _emit("started", pid=os.getpid())
        result = workflow_registry.get(name).workflow(cid).run(state)
        _emit("result", **_result_fields(result))
        return 0
    if argv[0] == "sweep":
        from django.core.management import call_command

        call_command("flowwarden_workflows", "recover", "--every")
        return 0
    action, cid = argv[0], argv[1]
    if action == "resume":
        result = Workflow.for_coordination(cid).resume(json.loads(argv[2]))
        _emit("result", **_result_fields(result))
        return 0
    if action == "race":

        def wait_in_step() -> None:
            _emit("in-step")
            if sys.stdin.readline().strip() != "continue":
                raise RuntimeError("expected 'continue'")

        on_race_step_one = wait_in_step
        _emit("ready")
        if sys.stdin.readline().strip() != "go":
            return 2
        try:
            result = Workflow.for_coordination(cid).run()
        except ConcurrentRunError as exc:
            _emit("concurrent", message=str(exc))
            return 0
        _emit("result", **_result_fields(result))
        return 0
    raise SystemExit(f"unknown action {action!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
