"""``manage.py flowwarden_streams``: run change-stream consumers, or show their status.

``status`` shows every declared stream as all processes report it (their
``StreamWorker`` rows), with its checkpoint ages, DLQ backlog and initial-sync
progress; ``--json`` prints the health view's JSON.

``resync STREAM`` copies the stream's collection again (after a confirmation, or
``--yes``): every process running it restarts it, and it copies every document to
its snapshot handler before streaming from a fresh position. The command follows
the copy with a progress bar until it is done (``--no-wait`` returns at once).

``run`` starts the declared streams (or those named with ``--stream``), each on its
own thread (``--asyncio``: all on one event loop, through pymongo's async driver;
``FLOWWARDEN["STREAM_RUNNER"]`` sets the default), until SIGTERM/SIGINT stops them
gracefully (every dirty processed
anchor is flushed). It first checks that each MongoDB client answers and says how
to fix it when one does not (then keeps retrying, one line a retry). ``--burst``
processes what is there, then stops; it gives up (exit status 1) when MongoDB does
not answer, or when it has not caught up within ``--timeout`` seconds. A
``SINGLE_LEADER`` stream whose lease another process holds stands by until it can
take it. ``--metrics-port`` serves this process's Prometheus counters.
"""

from __future__ import annotations

import signal
import threading
import time
from datetime import datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from ...common.formatting import NONE_TEXT, age_text, dump_json, format_table
from ...common.outages import error_summary
from ...streams.clients import client_hosts, probe
from ...streams.initial_sync.resync import ResyncError, request_resync
from ...streams.operations.display import state_notes
from ...streams.operations.status import PAUSED, StreamStatus, health_report, stream_status
from ...streams.registry import DuplicateStreamError, stream_registry
from ...streams.runtime.async_manager import AsyncStreamManager, new_stream_manager
from ...streams.runtime.manager import StreamManager
from ...streams.runtime.threaded import StreamState
from ...streams.spec import StreamSpec
from ...streams.stores import checkpoint_stores
from ..base import confirmed, os_user, port_number, positive_seconds
from ..copy_watch import CopyWatch


class Command(BaseCommand):
    """Runs stream consumers in this process, or reports every stream's status."""

    help = (
        "Run change-stream consumers (run [--stream NAME ...] [--burst]), "
        "show their status (status [--json]) or copy a stream's collection again "
        "(resync NAME [--yes])."
    )

    #: Seconds between progress lines while running.
    progress_interval = 30.0

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        run = actions.add_parser("run", help="Consume streams until stopped (SIGTERM/SIGINT).")
        run.add_argument(
            "--stream",
            action="append",
            dest="streams",
            metavar="NAME",
            help="Run only this stream (repeatable). Default: every enabled auto-start stream.",
        )
        run.add_argument("--burst", action="store_true", help="Process what is there, then stop.")
        runner = run.add_mutually_exclusive_group()
        runner.add_argument(
            "--asyncio",
            action="store_const",
            const="asyncio",
            dest="runner",
            help="Run every stream as a task on one event loop (async handlers awaited "
            'natively). Default: FLOWWARDEN["STREAM_RUNNER"].',
        )
        runner.add_argument(
            "--threads",
            action="store_const",
            const="threads",
            dest="runner",
            help="Run each stream on a thread of its own.",
        )
        run.add_argument(
            "--timeout",
            type=positive_seconds,
            default=30.0,
            metavar="SECONDS",
            help="With --burst: give up (exit status 1) after this long (default 30).",
        )
        run.add_argument(
            "--metrics-port",
            type=port_number,
            metavar="PORT",
            help="Serve this process's Prometheus metrics on PORT (needs prometheus-client).",
        )
        status = actions.add_parser(
            "status", help="Show every declared stream as all processes report it."
        )
        status.add_argument(
            "--json",
            action="store_true",
            help="Print the health report (the /flowwarden/health/ JSON) instead of a table.",
        )
        resync = actions.add_parser(
            "resync",
            help="Copy a stream's collection again, then stream from a fresh position.",
        )
        resync.add_argument("name", metavar="STREAM", help="The stream to resync.")
        resync.add_argument("-y", "--yes", action="store_true", help="Do not ask for confirmation.")
        resync.add_argument(
            "--no-wait",
            action="store_false",
            dest="wait",
            help="Return once requested instead of following the copy with a progress bar.",
        )

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        try:
            if action == "run":
                self.serve_metrics(options.get("metrics_port"))
                self.handle_run(
                    options.get("streams"),
                    options["burst"],
                    options["timeout"],
                    runner=options.get("runner"),
                )
            elif action == "resync":
                self.handle_resync(options["name"], yes=options["yes"], wait=options["wait"])
            else:
                self.handle_status(as_json=options["json"])
        except (DuplicateStreamError, ImproperlyConfigured) as exc:
            raise CommandError(str(exc)) from exc

    def handle_run(
        self,
        names: list[str] | None,
        burst: bool,
        timeout: float = 30.0,
        *,
        runner: str | None = None,
    ) -> None:
        manager = new_stream_manager(runner)
        declared = stream_registry.specs()
        if names:
            unknown = sorted(set(names) - set(declared))
            if unknown:
                raise CommandError(
                    f"No stream named {', '.join(unknown)}; declared: "
                    f"{', '.join(sorted(declared)) or 'none'}. See `manage.py flowwarden_streams "
                    "status`."
                )
        else:
            names = manager.startable()
        if not names:
            raise CommandError(
                "No stream to run: declare one with @change_stream in an app's streams.py "
                "(and enabled=True, auto_start=True), or name it with --stream."
            )
        self._check_mongodb(sorted({declared[n].client for n in names}), burst, timeout)
        if isinstance(manager, AsyncStreamManager):
            self.stdout.write(
                f"Running {len(names)} stream(s) on one event loop (asyncio, AsyncMongoClient)"
            )
        stop = threading.Event()
        deadline = time.monotonic() + timeout if burst else None

        def request_stop(signum: int, frame: Any) -> None:
            self.stdout.write(f"Received {signal.Signals(signum).name}: stopping gracefully...")
            stop.set()
            manager.stop_all(timeout=0)

        previous = {
            sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            for name in names:
                if stop.is_set():
                    break
                spec = declared[name]
                self.stdout.write(
                    f"Starting {name} ({spec.database or 'default db'}.{spec.collection})"
                    + (" in burst mode" if burst else "")
                )
                if manager.start(name, burst=burst) is None:
                    self.stdout.write(
                        f"  {name} is SINGLE_LEADER and another process holds its lease: "
                        "standing by"
                    )
            self._wait(manager, names, stop, deadline)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            manager.stop_all()
        self._report(manager, names)
        if deadline is not None and time.monotonic() > deadline:
            raise CommandError(
                f"--burst gave up after {timeout:g} s without catching up: "
                + "; ".join(self._why_not(manager, names))
            )

    def _check_mongodb(self, aliases: list[str], burst: bool, timeout: float) -> None:
        """Say at once, and how to fix it, when a MongoDB client does not answer; in
        burst mode that ends the command."""
        for alias in aliases:
            reason = probe(alias, timeout=min(timeout, 5.0))
            if reason is None:
                continue
            message = unreachable_message(alias, reason)
            if burst:
                raise CommandError(message)
            self.stderr.write(self.style.WARNING(f"{message} Retrying until it answers."))

    def _why_not(self, manager: StreamManager, names: list[str]) -> list[str]:
        reasons = []
        for name in names:
            consumer = manager.consumer(name)
            if consumer is not None and consumer.last_error is not None:
                reasons.append(f"{name}: {error_summary(consumer.last_error)}")
            else:
                reasons.append(f"{name}: {consumer.state.value if consumer else 'not started'}")
        return reasons

    def _wait(
        self,
        manager: StreamManager,
        names: list[str],
        stop: threading.Event,
        deadline: float | None = None,
    ) -> None:
        last_report = time.monotonic()
        while manager.any_running():
            if stop.wait(0.2):
                break
            if deadline is not None and time.monotonic() > deadline:
                break
            if time.monotonic() - last_report >= self.progress_interval:
                last_report = time.monotonic()
                self.stdout.write(
                    "  "
                    + "; ".join(
                        f"{n}: {manager.state_of(n)[0]}, {c.events_handled} events"
                        + (f", {c.documents_copied} documents copied" if c.documents_copied else "")
                        for n in names
                        if (c := manager.consumer(n)) is not None
                    )
                )
        # A stop requested while streams were starting reaches those started after it.
        manager.stop_all(timeout=None)

    def serve_metrics(self, port: int | None) -> None:
        """Expose this process's stream counters to Prometheus on *port*."""
        if port is None:
            return
        try:
            from prometheus_client import start_http_server

            from ...integrations.prometheus import REGISTRY
        except ImportError as exc:
            raise CommandError(
                "--metrics-port needs prometheus-client: "
                'pip install "flowwarden-django[prometheus]"'
            ) from exc
        try:
            start_http_server(port, registry=REGISTRY)
        except OSError as exc:
            raise CommandError(
                f"Cannot serve metrics on port {port}: {exc}. Pick a free port."
            ) from exc
        self.stdout.write(f"Prometheus metrics on http://0.0.0.0:{port}/metrics")

    def _report(self, manager: StreamManager, names: list[str]) -> None:
        crashed = []
        for name in names:
            consumer = manager.consumer(name)
            if consumer is None:
                continue
            copied = consumer.documents_copied
            line = (
                f"{name}: "
                + (f"{copied} documents copied, " if copied else "")
                + f"{consumer.events_handled} events handled, {consumer.state.value}"
            )
            if consumer.state == StreamState.CRASHED:
                crashed.append(name)
                self.stderr.write(self.style.ERROR(f"{line}: {consumer.last_error}"))
            else:
                self.stdout.write(self.style.SUCCESS(line))
        if crashed:
            raise CommandError(f"Stream(s) stopped on an error: {', '.join(crashed)}")

    def handle_resync(self, name: str, *, yes: bool, wait: bool = True) -> None:
        """Ask for a re-copy of stream *name*; follow it with a progress bar if it runs."""
        spec = stream_registry.specs().get(name)
        if spec is None:
            declared = ", ".join(sorted(stream_registry.specs())) or "none"
            raise CommandError(f"No stream named {name!r}; declared: {declared}.")
        self.stdout.write(
            f"Resync {name}: every process running it restarts it, copies every document of "
            f"{_namespace(spec)} to its snapshot "
            "handler, then streams from a fresh position. Changes made during the copy are "
            "delivered after it (handlers must be idempotent)."
        )
        if not confirmed(self, "Resync", yes=yes):
            return
        store = checkpoint_stores[spec.checkpoint_store]
        try:
            request_resync(name, by=f"{os_user()} (manage.py)")
        except ResyncError as exc:
            raise CommandError(f"Cannot resync: {exc}.") from exc
        requested = store.find(name)
        batch = int(requested.initial_sync["batch"]) if requested and requested.initial_sync else 0
        status = next((s for s in stream_status() if s.name == name), None)
        if status is None or not status.instances or status.state == PAUSED:
            self.stdout.write(
                f"Resync requested. No process runs {name} now: the copy starts when one "
                f"does (`manage.py flowwarden_streams run --stream {name}`)."
            )
            return
        if not wait:
            self.stdout.write(
                "Resync requested; follow it with `manage.py flowwarden_streams status`."
            )
            return
        self.stdout.write(
            "Resync requested; waiting for the stream to restart (Ctrl-C stops "
            "following, not the copy)..."
        )
        try:
            progress = CopyWatch(self, name, store, after_batch=batch).follow()
        except KeyboardInterrupt:
            self.stdout.write("\nStopped following; the copy goes on.")
            return
        self.stdout.write(self.style.SUCCESS(f"{name}: {progress.summary()}; streaming again."))

    def handle_status(self, *, as_json: bool = False) -> None:
        now = timezone.now()
        if as_json:
            report = health_report(now)
            if "error" in report:
                raise CommandError(f"Cannot read the stream status: {report['error']}")
            self.stdout.write(dump_json(report))
            return
        specs = stream_registry.specs()
        if not specs:
            self.stdout.write("No streams declared.")
            return
        rows = [_status_row(status, specs[status.name], now) for status in stream_status(now)]
        headers = (
            "STREAM",
            "NAMESPACE",
            "MODE",
            "STATE",
            "LEADER",
            "INSTANCES",
            "LAST EVENT",
            "CHECKPOINT",
            "HEARTBEAT",
            "DLQ",
            "NOTES",
        )
        for line in format_table(headers, rows):
            self.stdout.write(line.rstrip())


def _status_row(status: StreamStatus, spec: StreamSpec, now: datetime) -> tuple[str, ...]:
    """One line of ``status``: the cross-process state, ages and backlog of a stream."""
    notes = state_notes(status)
    if status.stale_instances:
        count = len(status.stale_instances)
        notes.append(f"{count} instance{'s' if count > 1 else ''} silent (no recent report)")
    if status.initial_sync is not None and status.initial_sync.copying:
        notes.append(status.initial_sync.summary())
    if status.error:
        notes.append(f"error: {status.error}")
    return (
        status.name,
        f"{spec.database or '-'}.{spec.collection}",
        spec.deployment_mode,
        status.state,
        status.leader or NONE_TEXT,
        str(len(status.live_instances)),
        age_text(status.last_event_time, now),
        age_text(status.checkpoint_at, now),
        age_text(status.heartbeat_at, now),
        NONE_TEXT if status.dlq_backlog is None else str(status.dlq_backlog),
        "; ".join(notes),
    )


def _namespace(spec: StreamSpec) -> str:
    if spec.database:
        return f"{spec.database}.{spec.collection}"
    return f"{spec.collection} (in the client's default database)"


def unreachable_message(alias: str, reason: str) -> str:
    """What to do about MongoDB client *alias* that does not answer (*reason*)."""
    return (
        f"MongoDB at {client_hosts(alias)} (client {alias!r}) is unreachable: {reason}. "
        f"Start it, or point FLOWWARDEN['MONGO_CLIENTS'][{alias!r}]['URL'] at a replica set "
        "(the sample project reads FLOWWARDEN_MONGO_URL); `manage.py demo` runs the sample's "
        "streams without MongoDB."
    )
