"""The command line of :mod:`.scripted_mongo`: serve a scripted replica set as a process
(for crash tests and demos), seeded and fed with inserts."""

from __future__ import annotations

import argparse
import signal
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .scripted_mongo import ScriptedReplicaSet


def serve(
    server_class: type[ScriptedReplicaSet], argv: list[str] | None, description: str | None
) -> int:
    """Serve a *server_class* until SIGTERM/SIGINT; print ``READY <uri>`` once listening
    (``scripted_mongo.main``)."""
    parser = argparse.ArgumentParser(
        prog="python -m flowwarden_django.testkit.scripted_mongo", description=description
    )
    parser.add_argument("--port", type=int, default=0, help="TCP port (0: pick a free one)")
    parser.add_argument("--events", type=int, default=0, help="insert events logged up front")
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="documents stored up front without events (_id/seq 1..N; events follow on)",
    )
    parser.add_argument("--db", default="app", help="database of the seeded and logged documents")
    parser.add_argument(
        "--coll", default="orders", help="collection of the seeded and logged documents"
    )
    parser.add_argument(
        "--feed-rate", type=float, default=0.0, help="keep inserting this many events per second"
    )
    parser.add_argument("--set-name", default="rs0", help="replica set name in the URI")
    parser.add_argument(
        "--idle-wait", type=float, default=0.02, help="longest wait of an idle getMore (s)"
    )
    parser.add_argument("--verbose", action="store_true", help="let mockupdb log every message")
    args = parser.parse_args(argv)

    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    server = server_class(
        port=args.port, set_name=args.set_name, idle_wait=args.idle_wait, verbose=args.verbose
    )
    with server:
        seeded = max(args.seed, 0)
        server.seed(args.db, args.coll, ({"_id": n, "seq": n} for n in range(1, seeded + 1)))
        last = seeded + args.events
        server.insert_many(
            args.db, args.coll, ({"_id": n, "seq": n} for n in range(seeded + 1, last + 1))
        )
        print(f"READY {server.uri}", flush=True)
        feeder = None
        if args.feed_rate > 0:
            feeder = threading.Thread(
                target=_feed,
                args=(server, args.db, args.coll, last + 1, args.feed_rate, stopping),
                daemon=True,
            )
            feeder.start()
        while not stopping.wait(0.1):
            pass
        if feeder is not None:
            feeder.join(5)
    return 0


def _feed(
    server: ScriptedReplicaSet,
    db: str,
    coll: str,
    first: int,
    rate: float,
    stopping: threading.Event,
) -> None:
    """Append inserts at *rate* per second (in small bursts) until *stopping* is set."""
    started, sent = time.monotonic(), 0
    while not stopping.wait(0.01):
        due = int((time.monotonic() - started) * rate) - sent
        if due > 0:
            seqs = range(first + sent, first + sent + due)
            server.insert_many(db, coll, ({"_id": n, "seq": n} for n in seqs))
            sent += due
