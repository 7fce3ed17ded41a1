"""The processes and servers of the sample's story (``tests/sample/test_story_celery.py``).

:class:`Service` is a long-running subprocess (the Celery worker, ``runserver``) in a
process group of its own, logging to a file; :func:`manage` runs one ``manage.py``
command to the end. :class:`StoryDatabase` creates and drops the story's PostgreSQL
database, :func:`delete_queue_keys` removes what the queue left in Redis.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _die_with_parent() -> None:
    """In the child: be SIGKILLed if the test process dies (Linux only)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def tail(text: str, lines: int = 40) -> str:
    """The last *lines* lines of *text*."""
    return "\n".join(text.splitlines()[-lines:]) or "(empty)"


class Service:
    """A subprocess that runs until stopped, in a session (process group) of its own,
    its stdout and stderr written to *log_path*."""

    def __init__(self, name: str, args: Sequence[str], env: dict[str, str], log_path: Path):
        self.name = name
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, *args],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: pool children included
                preexec_fn=_die_with_parent,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def describe(self, lines: int = 40) -> str:
        """Its name, log file and log tail, for a failure message."""
        return f"--- {self.name} (log {self.log_path}) ---\n{tail(self.log(), lines)}"

    def assert_alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise AssertionError(f"{self.name} exited on its own (code {code}):\n{self.describe()}")

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM the process (a warm shutdown: it stops its own children), then
        SIGKILL its process group after *timeout*; the exit code (``None`` when it had
        to be killed). Safe to call again."""
        code = self.proc.poll()
        if code is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = self.proc.wait(timeout=timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # stragglers of the group
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        return code


def manage(*args: str, env: dict[str, str], timeout: float = 60.0) -> str:
    """Run ``manage.py *args*``; its stdout. Fails with its output when it fails."""
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise AssertionError(
            f"manage.py {' '.join(args)} failed (code {result.returncode}):\n"
            f"{tail(result.stdout)}\n{tail(result.stderr)}"
        )
    return result.stdout + result.stderr


def wait_until(
    condition: Callable[[], Any],
    timeout: float,
    what: str | Callable[[], str],
    services: Sequence[Service] = (),
    *,
    interval: float = 0.1,
) -> Any:
    """Poll *condition* until it returns something true (returned); fail with *what*
    (or what it returns, when a function) and the services' logs if one of them dies
    or *timeout* seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        for service in services:
            service.assert_alive()
        if time.monotonic() > deadline:
            logs = "\n".join(service.describe() for service in services)
            text = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {text}\n{logs}")
        time.sleep(interval)


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:*port*."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


class StoryDatabase:
    """A PostgreSQL database made for one story run (``create``) and dropped after it
    (``drop``), with an autocommit connection to query it (``query``)."""

    def __init__(self, name: str, host: str, port: int, user: str, password: str) -> None:
        self.name = name
        self._server = {"host": host, "port": port, "user": user, "password": password}
        self._connection: Any = None

    def _admin(self) -> Any:
        import psycopg

        return psycopg.connect(dbname="postgres", autocommit=True, **self._server)

    def create(self) -> None:
        with self._admin() as admin:
            admin.execute(f'CREATE DATABASE "{self.name}"')

    def drop(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        with self._admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of *sql* (each query sees everything committed before it)."""
        import psycopg

        if self._connection is None:
            self._connection = psycopg.connect(dbname=self.name, autocommit=True, **self._server)
        return self._connection.execute(sql, params).fetchall()


def delete_queue_keys(client: Any, queue: str) -> list[bytes]:
    """Delete every key of Redis database *client* whose name contains *queue* (the
    queue's list, its kombu binding, the unacked-message keys); the keys deleted."""
    keys = list(client.scan_iter(match=f"*{queue}*"))
    if keys:
        client.delete(*keys)
    return keys
