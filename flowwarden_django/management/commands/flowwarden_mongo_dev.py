"""``manage.py flowwarden_mongo_dev``: a MongoDB replica set to develop against, with
no MongoDB installed: the scripted replica set of ``flowwarden_django.testkit``,
served on a port until Ctrl-C.

The real driver talks to it: an application inserts, updates (``$set``, ``$unset``,
``$inc``, a replacement), deletes and ``findAndModify``-s through its own code, and
its streams see each write as a change event. What it does not support (other
operators, upserts, transactions) it refuses with a clear error. It keeps everything
in memory: stopping it forgets the data.
"""

from __future__ import annotations

import signal
import threading
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ..base import add_options, positive_int

DEFAULT_PORT = 27018

#: The command's options: each flag with its ``add_argument`` keywords.
OPTIONS: dict[str, dict[str, Any]] = {
    "--port": {
        "type": positive_int,
        "default": DEFAULT_PORT,
        "help": f"The port to listen on, on 127.0.0.1 (default {DEFAULT_PORT}).",
    },
    "--seed": {
        "metavar": "FILE",
        "help": "Documents stored before any stream starts (no change events): a JSON "
        "array or one JSON document per line, in MongoDB Extended JSON.",
    },
    "--db": {"default": "app", "help": "The database of --seed (default app)."},
    "--coll": {"default": "orders", "help": "The collection of --seed (default orders)."},
}


class Command(BaseCommand):
    # A development server needs no database: the system checks (which, on Django 6,
    # reach every configured database) are not run.
    requires_system_checks: list[str] = []
    help = (
        "Serve a development MongoDB replica set (in memory; the testkit's scripted "
        "replica set) that your code and your streams can use. Ctrl-C stops it."
    )

    def add_arguments(self, parser: Any) -> None:
        add_options(parser, OPTIONS)

    def handle(self, *args: Any, port: int, seed: str | None, db: str, coll: str, **options: Any):
        if find_spec("mockupdb") is None or find_spec("pymongo") is None:
            raise CommandError(
                "The development MongoDB needs the testkit extra: "
                'pip install "flowwarden-django[testkit]", then run this again.'
            )
        from ...testkit.scripted_mongo import ScriptedReplicaSet

        documents = _read_seed(Path(seed)) if seed else []
        server = ScriptedReplicaSet(port=port)
        try:
            server.start()
        except OSError as exc:
            raise CommandError(
                f"Port {port} cannot be used ({exc}): is another server on it? "
                "Pick another with --port."
            ) from exc
        stopping = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stopping.set())
        try:
            if documents:
                try:
                    server.seed(db, coll, documents)
                except ValueError as exc:
                    raise CommandError(f"--seed: {exc}. Give each document its own _id.") from exc
                self.stdout.write(f"Seeded {len(documents)} document(s) into {db}.{coll}.")
            self.stdout.write(
                self.style.SUCCESS(f"Development MongoDB (in memory) at {server.uri}")
            )
            self.stdout.write(
                'Use it as FLOWWARDEN["MONGO_CLIENTS"]["default"]["URL"]; Ctrl-C stops it.'
            )
            self._serve(server, stopping)
        finally:
            server.stop()
        self.stdout.write("Stopped; its data is gone.")

    def _serve(self, server: Any, stopping: threading.Event) -> None:
        """Until stopped: a line when writes arrived (every few seconds at most). The
        cluster time alone moves with the wall clock, so the data version is watched."""
        last = server.data_version
        while not stopping.wait(2.0):
            version = server.data_version
            if version != last:
                now = server.cluster_time
                self.stdout.write(
                    f"{time.strftime('%H:%M:%S')}  writes arrived (cluster time "
                    f"{now.time}.{now.inc})"
                )
                last = version


def _read_seed(path: Path) -> list[dict[str, Any]]:
    """The documents of a seed file: a JSON array, or JSON lines (Extended JSON)."""
    from bson import json_util

    try:
        text = path.read_text()
    except OSError as exc:
        raise CommandError(f"--seed {path}: {exc.strerror or exc}.") from exc
    try:
        if text.lstrip().startswith("["):
            documents = json_util.loads(text)
        else:
            documents = [json_util.loads(line) for line in text.splitlines() if line.strip()]
    except ValueError as exc:
        raise CommandError(
            f"--seed {path} is not JSON ({exc}): give a JSON array of documents or one "
            "document per line."
        ) from exc
    if not all(isinstance(document, dict) for document in documents):
        raise CommandError(f"--seed {path}: every item must be a document ({{...}}).")
    return documents
