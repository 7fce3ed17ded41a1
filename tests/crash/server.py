"""The crash test's MongoDB: a ``ScriptedReplicaSet`` in its own process, fed on demand.

``python -m tests.crash.server --events 20000`` starts with an empty log and prints
``READY <uri>``. On SIGUSR1 it appends the inserts ``{_id: n, seq: n}`` for
``n = 1..events`` to ``app.orders`` (once) and prints ``FED <first token> <last token>``
(the ``_data`` of the resume tokens of events 1 and *events*). It serves until
SIGTERM/SIGINT, keeping its log across consumer restarts.

Why not ``python -m flowwarden_django.testkit.scripted_mongo --events N``: that CLI
logs its events before printing READY, so a consumer's first start bootstraps after
all of them and sees nothing. Feeding on a signal lets the consumer's first run
bootstrap for real on the empty log (the resume cascade's first level, whose anchor
it persists before any event) and then receive the events while it runs, which is
how a stream is deployed in production.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from flowwarden_django.testkit.scripted_mongo import ScriptedReplicaSet


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM; feed the events on SIGUSR1."""
    parser = argparse.ArgumentParser(prog="python -m tests.crash.server", description=__doc__)
    parser.add_argument("--events", type=int, default=20_000, help="inserts to log on SIGUSR1")
    parser.add_argument("--db", default="app")
    parser.add_argument("--coll", default="orders")
    args = parser.parse_args(argv)

    stopping, feed = threading.Event(), threading.Event()

    def on_stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    def on_feed(signum: int, frame: FrameType | None) -> None:
        feed.set()

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGUSR1, on_feed)

    with ScriptedReplicaSet(port=0) as server:
        print(f"READY {server.uri}", flush=True)
        fed = False
        while not stopping.wait(0.02):
            if feed.is_set() and not fed:
                docs = ({"_id": n, "seq": n} for n in range(1, args.events + 1))
                tokens = server.insert_many(args.db, args.coll, docs)
                print(f"FED {tokens[0]['_data']} {tokens[-1]['_data']}", flush=True)
                fed = True
        errors = server.internal_errors
        for error in errors:
            print(f"INTERNAL ERROR {error}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
