"""The initial-sync crash test's MongoDB: a seeded ``ScriptedReplicaSet``, driven over stdin.

``python -m tests.crash.copy_sync.server --seed 6000`` stores the documents
``{_id: n, seq: n, v: 0, tag: "seed"}`` for ``n = 1..6000`` in ``app.docs`` without
change events (a collection that existed before the stream), prints ``READY <uri>``
and then reads one JSON command a line on stdin, each answered by one line
``OK <json>`` (or ``ERROR <message>``) on stdout:

* ``{"cmd": "write", "ops": [...]}``: applies the writes in order, each with its
  change event: ``["insert", doc]``, ``["update", _id, {field: value}, [field, ...]]``
  (``$set`` / ``$unset``), ``["delete", _id]``. Answers ``{"position": [seconds,
  increment]}``, the position of the last write's event.
* ``{"cmd": "documents"}``: answers ``{"documents": [...]}``, the current documents.
* ``{"cmd": "gate", "name": NAME}``: arms the one-shot gate *NAME* (below).
* ``{"cmd": "release", "name": NAME}``: lets a held request go (it is hung up on:
  the test has killed its client meanwhile).
* ``{"cmd": "stop"}``: answers ``{"internal_errors": [...]}`` and exits (so does EOF).

**Gates** hold one request at a chosen point of an initial sync. When an armed gate's
request arrives, the server prints ``GATED <name>`` and holds it until released (at
most two minutes). mockupdb answers every connection under one lock, so the whole
server waits meanwhile, which no test here minds: its client is about to be killed.

* ``bootstrap``: the ``aggregate`` with ``cursor.batchSize: 0`` that reads the change
  stream's current position: the copy has written its first progress record and not
  yet captured (nor persisted) its position;
* ``empty-find``: a ``find`` on ``app.docs`` for ``_id`` greater than every stored
  ``_id``: the copy's read after its last full batch. Every batch is committed, the
  ``done`` progress is not written yet;
* ``resume``: a change-stream ``aggregate`` with ``resumeAfter``: the copy is done
  and the stream opens after the captured position.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from typing import Any

from flowwarden_django.common.plain_data import plain
from flowwarden_django.testkit._scripted_events import parse_token
from flowwarden_django.testkit.scripted_mongo import ScriptedReplicaSet
from tests.crash.copy_sync import COLLECTION, DATABASE, GATES

#: The longest a gate holds a request when the test never releases it.
GATE_HOLD_SECONDS = 120.0

_print_lock = threading.Lock()


def _say(line: str) -> None:
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class GatedReplicaSet(ScriptedReplicaSet):
    """A ``ScriptedReplicaSet`` whose one-shot gates hold a request (see the module)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._armed: set[str] = set()
        self._releases = {name: threading.Event() for name in GATES}

    def arm(self, name: str) -> None:
        """Hold the next request of gate *name*."""
        if name not in GATES:
            raise ValueError(f"unknown gate {name!r}")
        self._releases[name].clear()
        self._armed.add(name)

    def release(self, name: str) -> None:
        """Let the request held by gate *name* go (it is hung up on)."""
        self._armed.discard(name)
        self._releases[name].set()

    def _gate_of(self, request: Any) -> str | None:
        name = (request.command_name or "").lower()
        if name not in ("aggregate", "find") or not self._armed:
            return None
        doc = plain(request.doc)
        if name == "aggregate":
            pipeline = doc.get("pipeline") or [{}]
            stage = pipeline[0].get("$changeStream") if isinstance(pipeline[0], dict) else None
            if stage is None:
                return None
            if "bootstrap" in self._armed and (doc.get("cursor") or {}).get("batchSize") == 0:
                return "bootstrap"
            if "resume" in self._armed and "resumeAfter" in stage:
                return "resume"
            return None
        if "empty-find" in self._armed and (doc.get("$db"), doc.get("find")) == (
            DATABASE,
            COLLECTION,
        ):
            after = ((doc.get("filter") or {}).get("_id") or {}).get("$gt")
            if after is None:
                return None
            with self._cond:
                stored = self._log.documents.get((DATABASE, COLLECTION), {}).values()
                if all(document["_id"] <= after for document in stored):
                    return "empty-find"
        return None

    def _handle(self, request: Any) -> bool:
        gate = self._gate_of(request)
        if gate is None:
            return super()._handle(request)
        self._armed.discard(gate)
        _say(f"GATED {gate}")
        self._releases[gate].wait(GATE_HOLD_SECONDS)
        try:
            return request.hangup()
        except OSError:  # the client is gone already
            return True


def _apply(server: ScriptedReplicaSet, ops: list[list[Any]]) -> list[int] | None:
    event: dict[str, Any] | None = None
    for op in ops:
        kind = op[0]
        if kind == "insert":
            event = server.insert(DATABASE, COLLECTION, op[1])
        elif kind == "update":
            event = server.update(DATABASE, COLLECTION, op[1], op[2], op[3])
            if event is None:
                raise ValueError(f"the update {op!r} changed nothing")
        elif kind == "delete":
            event = server.delete(DATABASE, COLLECTION, op[1])
        else:
            raise ValueError(f"unknown write {kind!r}")
    return None if event is None else list(parse_token(event["_id"])[0])


def main(argv: list[str] | None = None) -> int:
    """Serve until the ``stop`` command or the end of stdin."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.crash.copy_sync.server", description=__doc__
    )
    parser.add_argument("--seed", type=int, default=0, help="documents stored up front")
    args = parser.parse_args(argv)

    with GatedReplicaSet(port=0) as server:
        server.seed(
            DATABASE,
            COLLECTION,
            ({"_id": n, "seq": n, "v": 0, "tag": "seed"} for n in range(1, args.seed + 1)),
        )
        _say(f"READY {server.uri}")
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                command = json.loads(line)
                cmd = command["cmd"]
                if cmd == "write":
                    reply: dict[str, Any] = {"position": _apply(server, command["ops"])}
                elif cmd == "documents":
                    reply = {"documents": server.documents(DATABASE, COLLECTION)}
                elif cmd == "gate":
                    server.arm(command["name"])
                    reply = {}
                elif cmd == "release":
                    server.release(command["name"])
                    reply = {}
                elif cmd == "stop":
                    _say("OK " + json.dumps({"internal_errors": server.internal_errors}))
                    break
                else:
                    raise ValueError(f"unknown command {cmd!r}")
            except Exception as exc:  # reported to the test, which fails on it
                _say(f"ERROR {exc!r}")
                continue
            _say("OK " + json.dumps(reply))
        for name in GATES:
            server.release(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
