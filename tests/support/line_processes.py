"""A Python subprocess of the tests that print JSON event lines (the dead-runner tests'
``tests.support.workflow_procs``, the fault tests' processes), on the host or, through
*wrap*, inside a network namespace: its stdout lines as they come, its stderr in a file."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.support.story_procs import ROOT, die_with_parent


def database_env(settings_dict: dict[str, Any], host: str, port: int) -> dict[str, str]:
    """The ``FW_WF_DB_*`` variables naming *settings_dict*'s database at *host*:*port*."""
    return {
        "FW_WF_DB_NAME": str(settings_dict["NAME"]),
        "FW_WF_DB_HOST": host,
        "FW_WF_DB_PORT": str(port),
        "FW_WF_DB_USER": str(settings_dict["USER"]),
        "FW_WF_DB_PASSWORD": str(settings_dict["PASSWORD"]),
    }


def configure_process(flowwarden: dict[str, Any]) -> None:
    """In the process: configure Django on :func:`database_from_env` with *flowwarden*
    as ``FLOWWARDEN``, and set it up."""
    import django
    from django.conf import settings

    settings.configure(
        SECRET_KEY="tests-only-not-secret",
        USE_TZ=True,
        TIME_ZONE="UTC",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        INSTALLED_APPS=["django.contrib.contenttypes", "flowwarden_django", "tests.testapp"],
        DATABASES={"default": database_from_env()},
        FLOWWARDEN=flowwarden,
    )
    django.setup()


def database_from_env() -> dict[str, Any]:
    """In the process: the PostgreSQL database :func:`database_env` named, with the
    libpq parameters of ``FW_WF_DB_OPTIONS`` (JSON) when set."""
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["FW_WF_DB_NAME"],
        "HOST": os.environ["FW_WF_DB_HOST"],
        "PORT": os.environ["FW_WF_DB_PORT"],
        "USER": os.environ.get("FW_WF_DB_USER", "postgres"),
        "PASSWORD": os.environ.get("FW_WF_DB_PASSWORD", ""),
        "OPTIONS": json.loads(os.environ.get("FW_WF_DB_OPTIONS", "{}")),
    }


class JsonLinesProcess:
    """``python -m MODULE ARGS`` (*args* starts with the module); *wrap* turns its argv
    into the command that runs it (``NetworkNamespace.command`` to run it inside)."""

    def __init__(
        self,
        args: Sequence[str],
        env: dict[str, str],
        log_path: Path,
        wrap: Callable[[list[str]], list[str]] = list,
    ) -> None:
        self.log_path = log_path
        self.stderr = log_path.open("wb")
        argv = [sys.executable, "-u", "-m", *args]
        self.proc = subprocess.Popen(
            wrap(argv),
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            preexec_fn=die_with_parent,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        #: Every line printed so far.
        self.printed: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.printed.append(line.rstrip("\n"))
            self.lines.put(line.rstrip("\n"))

    def events(self) -> list[dict[str, Any]]:
        """The JSON lines printed so far."""
        return [json.loads(line) for line in list(self.printed) if line.startswith("{")]

    def event(self, *names: str) -> dict[str, Any] | None:
        """The first event printed with one of *names*, if any yet."""
        return next((e for e in self.events() if e["event"] in names), None)

    def wait_for_line(self, prefix: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"no line {prefix!r}:\n{self.describe()}") from None
            if line.startswith(prefix):
                return line

    def describe(self) -> str:
        if not self.stderr.closed:
            self.stderr.flush()
        err = self.log_path.read_text(errors="replace")[-4000:] or "(no stderr)"
        return "stdout:\n" + "\n".join(self.printed[-30:]) + "\nstderr:\n" + err

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        """Send *signum* (if it still runs) and wait up to *timeout* s; its exit code,
        or ``None`` if it still ran (it is then killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            return None
        finally:
            self.stderr.close()
