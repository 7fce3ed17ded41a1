"""A real ``celery worker`` subprocess for the tests that need one: the stream and
workflow integration tests, the chaos scenarios and the crash tests.

:class:`CeleryWorker` runs ``celery -A tests.support.celery_app worker`` in a process group
of its own (a SIGKILL of the group takes the prefork children too), logging to a file,
and dies with the test process. The caller's *env* names the settings module and
what it reads.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.support.story_procs import ROOT, die_with_parent

#: Upper bounds of the waits: a hang fails the test instead of blocking CI.
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0


class CeleryWorker:
    """One ``celery worker`` subprocess of *pool* (``["--pool=solo"]``, say)."""

    def __init__(
        self,
        env: dict[str, str],
        pool: list[str],
        log_path: Path,
        *,
        name: str = "fw-test",
        wrap: Callable[[list[str]], list[str]] = list,
    ) -> None:
        self.log_path = log_path
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.support.celery_app",
            "worker",
            *pool,
            "--loglevel=INFO",
            f"--hostname={name}-{uuid.uuid4().hex[:8]}@%h",
            # Nothing to wait for from other workers: start at once.
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                wrap(command),  # wrap: NetworkNamespace.command, say
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: prefork children included
                preexec_fn=die_with_parent,
            )

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-lines:]) or "(empty worker log)"

    def assert_alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise AssertionError(f"the worker exited on its own (code {code}):\n{self.log_tail()}")

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Until the worker logs that it consumes its queue."""
        deadline = time.monotonic() + timeout
        while " ready." not in self.log():
            self.assert_alive()
            if time.monotonic() > deadline:
                raise AssertionError(f"the worker did not start:\n{self.log_tail()}")
            time.sleep(0.05)

    def terminate(self) -> int:
        """SIGTERM (warm shutdown) and the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the worker did not stop within {STOP_TIMEOUT:.0f} s of SIGTERM:\n"
                + self.log_tail()
            ) from None

    def kill(self) -> None:
        """SIGKILL the worker's process group if anything of it is left, and reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def lines_between(self, start: float, end: float, pattern: object) -> list[str]:
        """The log lines that *pattern* (a compiled regex whose group 1 is Celery's
        ``%Y-%m-%d %H:%M:%S,%f`` stamp) matches, stamped between two
        ``time.monotonic()`` values (the stamps are wall-clock, local time)."""
        offset = time.time() - time.monotonic()
        lines = []
        for line in self.log().splitlines():
            found = pattern.match(line)  # type: ignore[attr-defined]
            if found is None:
                continue
            stamp = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if start + offset <= stamp <= end + offset:
                lines.append(line)
        return lines


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, worker: CeleryWorker
) -> None:
    """Poll *condition*; fail if the worker dies or *timeout* passes."""
    deadline = time.monotonic() + timeout
    while not condition():
        worker.assert_alive()
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for {what}:\n{worker.log_tail()}"
            )
        time.sleep(0.02)


@contextlib.contextmanager
def default_producer(name: str, broker_url: str, queue: str) -> Iterator[Any]:
    """A Celery app this process sends tasks with and reads answers from, made the
    default app (what a project's Celery app is in its processes) until the block ends."""
    from celery import Celery
    from celery import _state as celery_state

    from tests.support.celery_workflow_settings import transport_options

    app = Celery(name, broker=broker_url, backend=broker_url, fixups=[])
    app.conf.task_default_queue = queue
    app.conf.broker_transport_options = transport_options(queue)
    previous = celery_state.default_app
    app.set_default()
    try:
        yield app
    finally:
        celery_state.set_default_app(previous)
        app.close()
