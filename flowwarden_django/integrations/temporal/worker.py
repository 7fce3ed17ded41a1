"""The Temporal worker of flowwarden workflows, as ``flowwarden_temporal_worker`` runs
it: the run workflow and its activities on one task queue, plus the recovery sweep
that wakes runs nothing is advancing (a wake that could not be sent, say)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from ...common.failure_log import FailureLog
from ...workflows.definition.databases import workflow_databases
from ...workflows.operations.recovery import position_of, recover_in_every_database
from .activities import ACTIVITIES
from .config import TemporalConfig
from .connection import open_client
from .handback import StepSlots, completer
from .messages import WAKE_SIGNAL, WORKFLOW_TYPE, Wake
from .provider import next_policy, run_start, signal_with_start
from .shutdown import StepExecutor, shut_down
from .workflow import RunWorkflow, ScheduledStartWorkflow

logger = logging.getLogger("flowwarden_django.temporal")

#: Workflow task slots (the SDK's default when only the activity slots are set).
WORKFLOW_TASK_SLOTS = 100


async def connect(
    config: TemporalConfig, *, retry_every: float = 2.0, stop: asyncio.Event | None = None
) -> Any:
    """A client of the configured server, waiting (and saying so) until it answers;
    ``None`` when *stop* is set first (a SIGTERM while the server is down must end the
    process, not wait for the server)."""
    stop = stop or asyncio.Event()
    announced = False
    while not stop.is_set():
        attempt = asyncio.ensure_future(
            asyncio.wait_for(open_client(config), config.connect_timeout)
        )
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({attempt, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not attempt.done():
            attempt.cancel()
            break
        try:
            return attempt.result()
        except Exception as exc:
            if not announced:
                logger.warning(
                    "Temporal at %s does not answer (%s); retrying every %.0f s",
                    config.target,
                    exc,
                    retry_every,
                )
                announced = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), retry_every)
    return None


def build_worker(
    client: Any, config: TemporalConfig, *, concurrency: int, steps: StepExecutor | None = None
) -> Any:
    """The SDK worker: the run workflow (sandboxed; the app's modules pass through)
    and the activities on *steps*, a pool of *concurrency* threads."""
    from temporalio.worker import FixedSizeSlotSupplier, Worker, WorkerTuner
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

    restrictions = SandboxRestrictions.default.with_passthrough_modules("flowwarden_django")
    tuner = WorkerTuner.create_composite(
        workflow_supplier=FixedSizeSlotSupplier(WORKFLOW_TASK_SLOTS),
        # No step is taken while this worker's database is silent (``handback``).
        activity_supplier=StepSlots(concurrency),
        local_activity_supplier=FixedSizeSlotSupplier(concurrency),
        nexus_supplier=FixedSizeSlotSupplier(WORKFLOW_TASK_SLOTS),
    )
    return Worker(
        client,
        task_queue=config.task_queue,
        workflows=[RunWorkflow, ScheduledStartWorkflow],
        activities=list(ACTIVITIES),
        activity_executor=steps or StepExecutor(concurrency),
        tuner=tuner,
        workflow_runner=SandboxedWorkflowRunner(restrictions=restrictions),
        graceful_shutdown_timeout=timedelta(seconds=30),
        # A killed worker's cached runs move to another worker after this (the SDK's
        # default is 10 s, which a step's retry would wait out).
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=3),
    )


def recover(config: TemporalConfig, client_call: Any) -> list[str]:
    """Wake every stalled running run (``workflows.operations.recovery``) of every database a
    defined workflow uses; the ids woken."""
    from ...workflows.definition.registry import workflow_registry

    def enqueue(run: Any) -> None:
        definition = workflow_registry.get(run.workflow_name, run.workflow_version)
        start = run_start(config, definition, run.coordination_id)
        # Its newest snapshot says which step comes next (a jump's target, say).
        policy = next_policy(config, definition, *position_of(run))
        wake = Wake("recover", policy=policy, version=definition.version)
        client_call(lambda client: signal_with_start(client, config, start, wake))

    return recover_in_every_database(enqueue)


#: Every how many sweeps the worker also ends the Temporal workflows of finished runs.
RECONCILE_EVERY = 15
#: The most open Temporal workflows one reconciliation reads.
RECONCILE_LIMIT = 1000


async def open_run_workflows(client: Any, config: TemporalConfig) -> list[str]:
    """The workflow ids (coordination ids) of the run workflows open on the task queue."""
    query = (
        f'WorkflowType = "{WORKFLOW_TYPE}" AND ExecutionStatus = "Running" '
        f'AND TaskQueue = "{config.task_queue}"'
    )
    ids: list[str] = []
    async for execution in client.list_workflows(query):
        ids.append(execution.id)
        if len(ids) >= RECONCILE_LIMIT:
            break
    return ids


def reconcile(config: TemporalConfig, client_call: Any) -> list[str]:
    """End the open Temporal workflows whose run finished another way (in-process while
    the server was down, say): each gets a ``refresh`` wake, re-reads its run and
    returns. The ids refreshed."""
    from ...common.app_models import models
    from ...workflows.runs.records import RunStatus

    open_ids = client_call(lambda client: open_run_workflows(client, config))
    # The runs live where their workflows keep them: every database a workflow uses.
    finished: list[str] = []
    for db in workflow_databases():
        finished += (
            models.WorkflowRun.objects.using(db)
            .filter(
                pk__in=open_ids,
                status__in=(RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED),
            )
            .values_list("pk", flat=True)
        )
    for cid in finished:

        async def refresh(client: Any, cid: str = cid) -> None:
            await client.get_workflow_handle(cid).signal(WAKE_SIGNAL, Wake("refresh"))

        client_call(refresh)
    if finished:
        logger.info("reconciled %d finished run(s) with Temporal: %s", len(finished), finished)
    return finished


async def serve(
    config: TemporalConfig,
    *,
    concurrency: int,
    recover_every: float | None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run the worker until SIGTERM/SIGINT (or *stop*), then shut down gracefully:
    steps in flight finish (up to 30 s) before the process ends."""
    from django.db import close_old_connections

    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    client = await connect(config, stop=stop)
    if client is None:
        logger.info("flowwarden Temporal worker: stopped before Temporal answered")
        return
    steps = StepExecutor(concurrency)
    worker = build_worker(client, config, concurrency=concurrency, steps=steps)

    def call(operation: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(operation(client), loop).result(config.call_timeout)

    def _recover_in_thread(config: TemporalConfig, call: Any, sweeps: int) -> list[str]:
        close_old_connections()
        try:
            if sweeps % RECONCILE_EVERY == 0:
                reconcile(config, call)
            return recover(config, call)
        finally:
            close_old_connections()

    # Not the loop's default executor: asyncio.run joins that one's threads, and a sweep
    # waiting on a server that went down must not hold the stopping process.
    sweep_pool = ThreadPoolExecutor(1, thread_name_prefix="flowwarden-sweep")
    sweep_failures = FailureLog(logger, "the recovery sweep (tried again every sweep)")

    async def sweep_forever() -> None:
        sweeps = 0
        while recover_every:
            await asyncio.sleep(recover_every)
            try:
                woken = await loop.run_in_executor(
                    sweep_pool, _recover_in_thread, config, call, sweeps
                )
            except Exception as exc:
                sweep_failures.failed(exc)
                continue
            finally:
                sweeps += 1
            sweep_failures.succeeded()
            if woken:
                logger.info("recovery sweep: woke %d stalled run(s): %s", len(woken), woken)

    logger.info(
        "flowwarden Temporal worker: %s, namespace %s, task queue %s, %d step(s) at once",
        config.target,
        config.namespace,
        config.task_queue,
        concurrency,
    )
    # A step whose run's claim lapses fails its own attempt through this client.
    completer.install(client, loop)
    try:
        running = asyncio.create_task(worker.run())
        sweeper = asyncio.create_task(sweep_forever())
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        sweeper.cancel()
        stopping.cancel()
        sweep_pool.shutdown(wait=False, cancel_futures=True)
        if running.done():
            running.result()  # the SDK gave up (it raises why); a supervisor restarts it
            return
        logger.info("flowwarden Temporal worker: stopping (steps in flight finish first)")
        await shut_down(worker, steps)
        logger.info("flowwarden Temporal worker: stopped")
    finally:
        completer.uninstall()
