"""Initial sync under SIGKILL and history loss: the mirror ends equal to the collection.

The first two scenarios run like the crash test (``tests/streams/test_crash.py``): a
scripted MongoDB server in one subprocess (``tests/crash/copy_sync/server.py``,
seeded with existing documents, driven over its stdin), the consumer
(``manage.py flowwarden_streams run --<runner> --stream ...`` with
``DJANGO_SETTINGS_MODULE=tests.crash.copy_sync.settings``) in another, the ORM
checkpoint store and the handlers' rows in the PostgreSQL test database. The
streams (``tests/crash/copy_sync/streams.py``) copy ``app.docs`` into ``MirrorDoc``
(upserts; updates applied from their ``updateDescription``; deletes), and each copied
document also writes one ``Effect`` row: the delivery log. The test writes to the
collection during the copy (inserts, updates with ``$set``/``$unset``, deletes,
behind and ahead of the copy's position) and keeps its own model of it. Every
scenario ends by comparing the mirror with the server's final documents: same
``_id`` values, same fields, same values.

1. **SIGKILL at three points of the copy** (``copy-mirror``, non-transactional,
   6,000 documents, batches of 500). Kills: (a) when the progress record is started
   but the position not yet captured (the server holds the ``batchSize: 0``
   bootstrap ``aggregate``); (b) mid-copy once four batches are committed; (c) after
   the last batch is committed and before the ``done`` write (the server holds the
   copy's final, empty ``find``; the test makes the documents left to copy a
   multiple of the batch size so that this read happens); and (d) just as streaming
   starts (the server holds the change stream's ``resumeAfter`` ``aggregate``).
   Checked from the delivery log and the progress record: after (a) the copy starts
   over (nothing was committed) with a fresh position and its original
   ``started_at``; after (b) it resumes right after the last committed batch (the
   next run copies exactly the documents after ``last_id``, in order, and logs
   ``resumes at <copied>``), keeping the captured position; after (c) and (d)
   nothing is copied again. Writes during run (c) stay behind ``last_id`` (and
   updates ahead) so the documents that run copies are known.
2. **Transactional copy killed mid-batch** (``copy-mirror-tx``, 4,000 documents,
   batches of 250). Each kill waits for two more committed batches, then for the
   copier's session to hold an open write transaction on the test app's tables
   (``pg_stat_activity.backend_xid``), then SIGKILLs. A kill counts as mid-batch
   when the ``Effect`` id sequence ran past the highest committed row: rows were
   inserted and rolled back. Three mid-batch kills are required (at most six
   kills). After each kill the committed rows are exactly the progress record's
   ``copied`` documents, up to ``last_id``; at the end every document copied has
   exactly one row (0 duplicates, none missing). While the consumer is down, the
   test deletes documents behind the copy and inserts new ones ahead of it, so the
   documents that must have a row are known.
3. **History lost mid-copy** (in process, on the scripted replica set with the real
   driver, with the in-memory and the ORM checkpoint store; ``test_initial_sync.py``
   covers history lost after a finished copy). The oplog is truncated while the first
   copy runs: the position it captured is gone when it ends. Under ``RESYNC`` the
   stream copies again (``reason: history lost``, batch numbers continuing) and then
   streams; the mirror drops, at the end of each copy, the rows that copy did not
   deliver (a document deleted while the history was lost has no delete event left).
   Under ``FAIL`` the consumer stops with ``HistoryLostError`` once the copy is done.

Scenarios 1 and 2 run on both runners of ``flowwarden_streams run``, with the same
checks (test ids ``[threads]`` and ``[asyncio]``). Under ``--asyncio`` the copy runs on
a worker thread through the same sync code and driver as the threaded consumer, then
the stream opens natively on pymongo's ``AsyncMongoClient``: kill (d) lands on that
async ``resumeAfter`` aggregate, and the last run streams on the event loop.

The summaries are printed even without ``-s`` and recorded as JUnit properties.
``FLOWWARDEN_CRASH_SEED`` replays the writes and kill jitter (not the timing).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import queue
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pymongo", reason="the initial-sync crash test needs pymongo")
pytest.importorskip("mockupdb", reason="the scripted MongoDB server needs mockupdb==1.8.1")

from django.conf import settings
from django.db import connections
from django.db.models import Max
from django.test import override_settings

from flowwarden_django.streams import metrics
from flowwarden_django.streams.backends.memory import InMemoryCheckpointStore
from flowwarden_django.streams.backends.orm import OrmCheckpointStore
from flowwarden_django.streams.initial_sync import decode_id
from flowwarden_django.streams.runtime import HistoryLostError, StreamConsumer, StreamState
from flowwarden_django.streams.runtime.manager import pymongo_source
from flowwarden_django.streams.spec import CheckpointSpec, RestartPolicySpec, StreamSpec
from flowwarden_django.testkit._scripted_events import parse_token
from tests.crash.copy_sync import GATES, SNAPSHOT, STREAM, TRANSACTIONAL_STREAM
from tests.streams.test_crash import (
    APPLICATION_NAME,
    ROOT,
    RUNNERS,
    START_TIMEOUT,
    STOP_TIMEOUT,
    Consumer,
    _stop,
    _wait_sessions_gone,
    _wait_until,
)
from tests.support.lanes import on_lane
from tests.support.story_procs import die_with_parent
from tests.testapp.models import Effect, MirrorDoc

#: Upper bounds of the waits: a hang fails the test instead of blocking CI.
PROGRESS_TIMEOUT = 90.0
CATCH_UP_TIMEOUT = 120.0
REPLY_TIMEOUT = 30.0
#: Scenario 1: the seeded documents and the batch size.
DOCUMENTS, BATCH = 6000, 500
#: Scenario 1: batches committed by the second run before kill (b).
BATCHES_BEFORE_KILL = 4
#: Scenario 2.
TX_DOCUMENTS, TX_BATCH = 4000, 250
TX_MID_BATCH_KILLS, TX_MAX_KILLS = 3, 6
#: Scenario 2: the longest delay between seeing the open transaction and the SIGKILL.
TX_KILL_JITTER_SECONDS = 0.03

Position = tuple[int, int]
Ops = list[list[Any]]
Range = tuple[float, float]
EVERYWHERE: Range = (float("-inf"), float("inf"))


# -- the collection, as the test writes it -------------------------------------------- #


class Collection:
    """The test's model of ``app.docs``: it draws valid random writes and applies them.

    The server seeds ``{_id: n, seq: n, v: 0, tag: "seed"}`` for ``n = 1..documents``.
    New documents get ``_id`` values above every one so far (*ahead* of any copy) or
    ``0, -1, -2...`` (*behind* a copy that has committed a batch).
    """

    def __init__(self, documents: int, rng: random.Random) -> None:
        self.docs: dict[int, dict[str, Any]] = {
            n: {"_id": n, "seq": n, "v": 0, "tag": "seed"} for n in range(1, documents + 1)
        }
        self.rng = rng
        self.high, self.low, self.version = documents + 1, 0, 0
        self.counts: Counter[str] = Counter()

    def ids_in(self, span: Range) -> list[int]:
        """The stored ``_id`` values within *span* (inclusive)."""
        return [key for key in self.docs if span[0] <= key <= span[1]]

    def insert(self, *, ahead: bool = True) -> list[Any]:
        """A new document ahead of (or behind) every stored one; applied to the model."""
        if ahead:
            key, self.high = self.high, self.high + 1
        else:
            key, self.low = self.low, self.low - 1
        self.version += 1
        doc = {"_id": key, "seq": key, "v": self.version, "tag": "new"}
        self.docs[key] = doc
        self.counts["insert"] += 1
        return ["insert", dict(doc)]

    def update(self, key: int) -> list[Any]:
        """``$set`` a new ``v`` (so it always changes), sometimes a note, or ``$unset`` one."""
        doc = self.docs[key]
        self.version += 1
        set_fields: dict[str, Any] = {"v": self.version}
        unset: list[str] = []
        draw = self.rng.random()
        if draw < 0.3:
            set_fields["note"] = f"n{self.version}"
        elif draw < 0.5 and "note" in doc:
            unset.append("note")
        elif draw < 0.6 and "tag" in doc:
            unset.append("tag")
        doc.update(set_fields)
        for field_name in unset:
            doc.pop(field_name)
        self.counts["update"] += 1
        return ["update", key, set_fields, unset]

    def delete(self, key: int) -> list[Any]:
        """Delete a stored document; applied to the model."""
        del self.docs[key]
        self.counts["delete"] += 1
        return ["delete", key]

    def writes(
        self,
        count: int,
        *,
        update: Range = EVERYWHERE,
        delete: Range | None = EVERYWHERE,
        insert: tuple[str, ...] = ("ahead", "behind"),
    ) -> Ops:
        """*count* random writes: updates of documents in *update*, deletes of documents
        in *delete* (``None``: none), inserts ``"ahead"`` and/or ``"behind"``."""
        ops: Ops = []
        for _ in range(count):
            kinds = ["update"] * 3 + ["delete"] + ["insert"] * bool(insert)
            kind = self.rng.choice(kinds)
            if kind == "delete":
                candidates = self.ids_in(delete) if delete is not None else []
                if candidates:
                    ops.append(self.delete(self.rng.choice(candidates)))
                    continue
                kind = "update"
            if kind == "update":
                candidates = self.ids_in(update)
                if candidates:
                    ops.append(self.update(self.rng.choice(candidates)))
                    continue
            if insert:
                ops.append(self.insert(ahead=self.rng.choice(insert) == "ahead"))
        return ops


def _fields(doc: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in doc.items() if key != "_id"}


def _compare(mirror: dict[Any, dict[str, Any]], documents: list[dict[str, Any]]) -> None:
    """Assert *mirror* (``_id`` -> fields) holds exactly *documents*, with a short diff."""
    expected = {doc["_id"]: _fields(doc) for doc in documents}
    if mirror == expected:
        return
    missing = sorted(set(expected) - set(mirror))
    extra = sorted(set(mirror) - set(expected))
    wrong = sorted(k for k in set(expected) & set(mirror) if expected[k] != mirror[k])
    details = [f"{k}: mirror {mirror[k]} != server {expected[k]}" for k in wrong[:5]]
    raise AssertionError(
        f"the mirror differs from the server's documents: {len(missing)} missing "
        f"{missing[:10]}, {len(extra)} extra {extra[:10]}, {len(wrong)} with other "
        f"values: {details}"
    )


# -- the processes --------------------------------------------------------------------- #


class CopyServer:
    """The scripted server subprocess (``tests/crash/copy_sync/server.py``) and its stdin."""

    def __init__(self, documents: int, log_path: Path) -> None:
        self._log = log_path.open("w")
        self.log_path = log_path
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.crash.copy_sync.server", "--seed", str(documents)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        self._replies: queue.Queue[str | None] = queue.Queue()
        self._gated = {name: threading.Event() for name in GATES}
        threading.Thread(target=self._read, name="copy-server-stdout", daemon=True).start()
        self.writes = 0
        try:
            ready = self._reply(START_TIMEOUT, "its READY line")
            assert ready.startswith("READY mongodb://"), ready
        except BaseException:
            self.close()
            raise
        self.uri = ready.split()[1]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with contextlib.suppress(OSError, ValueError):  # closed by close()
            for line in self.proc.stdout:
                line = line.strip()
                if line.startswith("GATED "):
                    self._gated[line.split()[1]].set()
                elif line:
                    self._replies.put(line)
        self._replies.put(None)

    def _reply(self, timeout: float, what: str) -> str:
        try:
            line = self._replies.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"no {what} from the scripted server within {timeout:.0f} s"
            ) from None
        if line is None:
            raise AssertionError(f"the scripted server exited (code {self.proc.wait()})")
        return line

    def call(self, cmd: str, **arguments: Any) -> dict[str, Any]:
        """Send one command and return its answer (see the server's docstring)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **arguments}) + "\n")
        self.proc.stdin.flush()
        line = self._reply(REPLY_TIMEOUT, f"answer to {cmd!r}")
        assert line.startswith("OK "), f"the scripted server answered {cmd!r} with: {line}"
        return json.loads(line[3:])

    def write(self, ops: Ops) -> Position | None:
        """Apply *ops*; the position of the last one's change event (None: no ops)."""
        if not ops:
            return None
        self.writes += len(ops)
        position = self.call("write", ops=ops)["position"]
        return (position[0], position[1])

    def documents(self) -> list[dict[str, Any]]:
        """The server's current documents."""
        return self.call("documents")["documents"]

    def gate(self, name: str) -> None:
        """Arm the one-shot gate *name*."""
        self._gated[name].clear()
        self.call("gate", name=name)

    def gated(self, name: str) -> bool:
        """Whether gate *name* holds a request now (or did since it was armed)."""
        return self._gated[name].is_set()

    def wait_gated(self, name: str, consumer: Consumer) -> None:
        """Wait until gate *name* holds a request of *consumer*."""
        _wait_until(
            self._gated[name].is_set, PROGRESS_TIMEOUT, f"the {name} gate", consumer, self.proc
        )

    def release(self, name: str) -> None:
        """Let the request held by gate *name* go."""
        self.call("release", name=name)

    def stop(self) -> list[str]:
        """Stop the server; the internal errors it reported (tracebacks)."""
        errors = self.call("stop")["internal_errors"]
        self.proc.wait(timeout=STOP_TIMEOUT)
        return errors

    def close(self) -> None:
        """Kill the server if it still runs."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        self.proc.stdin = None
        _stop(self.proc)
        self._log.close()


class StreamProcess(Consumer):
    """The consumer subprocesses of one stream (:class:`tests.streams.test_crash.Consumer`):
    ``manage.py flowwarden_streams run --<runner> --stream <stream>``."""

    def run_log(self, start: int) -> str:
        """What consumer start number *start* logged."""
        text = self.log_path.read_text(errors="replace")
        return text.split(f"===== consumer start {start} =====")[1].split("===== consumer")[0]


@contextlib.contextmanager
def _processes(
    stream: str, documents: int, batch: int, tmp_path: Path, runner: str = "threads"
) -> Iterator[tuple[CopyServer, StreamProcess]]:
    """The seeded server and the (not yet started) consumer of *stream* on *runner*; both
    cleaned up."""
    db = connections["postgres"].settings_dict
    server = CopyServer(documents, tmp_path / "server.log")
    consumer: StreamProcess | None = None
    try:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "tests.crash.copy_sync.settings",
            "FLOWWARDEN_CRASH_MONGO_URL": server.uri,
            "FLOWWARDEN_CRASH_DB_NAME": db["NAME"],
            "FLOWWARDEN_CRASH_DB_HOST": str(db["HOST"]),
            "FLOWWARDEN_CRASH_DB_PORT": str(db["PORT"]),
            "FLOWWARDEN_CRASH_DB_USER": str(db["USER"]),
            "FLOWWARDEN_CRASH_DB_PASSWORD": str(db["PASSWORD"] or ""),
            "FLOWWARDEN_COPY_BATCH": str(batch),
        }
        consumer = StreamProcess(
            env, tmp_path / f"consumer-{stream}-{runner}.log", runner=runner, stream=stream
        )
        yield server, consumer
    finally:
        if consumer is not None:
            consumer.close()
        server.close()


def _kill(consumer: StreamProcess, db_name: str) -> None:
    """SIGKILL the consumer and wait until PostgreSQL has ended its sessions (an
    in-flight COMMIT is then settled one way or the other)."""
    consumer.kill()
    _wait_sessions_gone(db_name)


# -- the data -------------------------------------------------------------------------- #


def _progress(store: OrmCheckpointStore, stream: str) -> dict[str, Any] | None:
    saved = store.find(stream)
    return None if saved is None or saved.initial_sync is None else dict(saved.initial_sync)


def _last_row() -> int:
    return Effect.objects.using("postgres").aggregate(m=Max("id"))["m"] or 0


def _copied(after_row: int = 0, upto_row: int | None = None) -> list[int]:
    """The ``_id`` of each copied document in the delivery log, in delivery order."""
    rows = Effect.objects.using("postgres").filter(stream=SNAPSHOT, id__gt=after_row)
    if upto_row is not None:
        rows = rows.filter(id__lte=upto_row)
    return list(rows.order_by("id").values_list("order_id", flat=True))


def _mirror() -> dict[Any, dict[str, Any]]:
    return {row.doc_id: row.data for row in MirrorDoc.objects.using("postgres")}


def _processed(store: OrmCheckpointStore, stream: str) -> Position | None:
    saved = store.find(stream)
    if saved is None or saved.last_processed_token is None:
        return None
    return parse_token(saved.last_processed_token)[0]


def _catch_up(
    store: OrmCheckpointStore,
    stream: str,
    last_write: Position,
    consumer: StreamProcess,
    server: CopyServer,
) -> None:
    """Wait until the stream's processed anchor reaches the last write's event."""
    _wait_until(
        lambda: (_processed(store, stream) or (0, 0)) >= last_write,
        CATCH_UP_TIMEOUT,
        f"the processed anchor to reach the last write {last_write}",
        consumer,
        server.proc,
    )


def _copy_until(
    store: OrmCheckpointStore,
    stream: str,
    done: Callable[[dict[str, Any]], bool],
    on_batch: Callable[[dict[str, Any]], None],
    what: str,
    consumer: StreamProcess,
    server: CopyServer,
) -> dict[str, Any]:
    """Wait until *done(progress)*; call *on_batch(progress)* on each new batch number.
    Returns the progress record that satisfied *done*."""
    seen: list[Any] = [None]
    reached: list[dict[str, Any]] = []

    def check() -> bool:
        progress = _progress(store, stream)
        if progress is None:
            return False
        if progress["batch"] != seen[0]:
            seen[0] = progress["batch"]
            if progress["phase"] == "copying":
                on_batch(progress)
        if done(progress):
            reached.append(progress)
            return True
        return False

    _wait_until(check, PROGRESS_TIMEOUT, what, consumer, server.proc)
    return reached[0]


def _open_write_transaction(db_name: str) -> bool:
    """Whether a consumer session is inside a write transaction on the test app's
    tables: a transactional batch with rows written and not committed."""
    with connections["postgres"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
            "AND application_name = %s AND backend_xid IS NOT NULL "
            "AND query LIKE %s",
            [db_name, APPLICATION_NAME, "%testapp_%"],
        )
        return cursor.fetchone()[0] > 0


def _effect_sequence() -> int:
    """The last value the ``Effect`` id sequence handed out (rolled back rows included)."""
    with connections["postgres"].cursor() as cursor:
        cursor.execute("SELECT pg_get_serial_sequence('testapp_effect', 'id')")
        (sequence,) = cursor.fetchone()
        cursor.execute(f"SELECT last_value, is_called FROM {sequence}")
        last_value, called = cursor.fetchone()
    return last_value if called else 0


def _report(record_property: Callable[[str, Any], None], **counts: Any) -> str:
    """Record *counts* as JUnit properties; ``key=value ...`` for the summary line."""
    for key, value in counts.items():
        record_property(key, value)
    return " ".join(f"{key}={value}" for key, value in counts.items())


def _seed_rng(record_property: Callable[[str, Any], None]) -> tuple[int, random.Random]:
    seed = int(os.environ.get("FLOWWARDEN_CRASH_SEED") or random.randrange(2**32))
    record_property("seed", seed)
    return seed, random.Random(seed)


# -- 1. SIGKILL at three points of the copy -------------------------------------------- #


@dataclass(frozen=True)
class CopyKill:
    """What the data said right after one SIGKILL of scenario 1."""

    point: str
    batch: int
    copied: int
    last_id: Any
    last_row: int  # the highest Effect id: the end of this consumer run's deliveries


@pytest.mark.slow
@on_lane("postgres", databases=["default", "postgres"])
@pytest.mark.parametrize("runner", RUNNERS)
def test_copy_survives_sigkill_at_three_points(runner, tmp_path, capsys, record_property):
    """Kills before the position, mid-copy, before done and as streaming starts: the
    copy resumes after its last committed batch and the mirror equals the collection."""
    seed, rng = _seed_rng(record_property)
    record_property("runner", runner)
    db_name = connections["postgres"].settings_dict["NAME"]
    store = OrmCheckpointStore(using="postgres")
    assert not Effect.objects.using("postgres").exists()
    assert not MirrorDoc.objects.using("postgres").exists()
    docs = Collection(DOCUMENTS, rng)
    kills: list[CopyKill] = []
    started = time.monotonic()

    def kill(point: str) -> CopyKill:
        _kill(consumer, db_name)
        progress = _progress(store, STREAM)
        assert progress is not None
        last_id = decode_id(progress["last_id"]) if progress["last_id"] else None
        at = CopyKill(point, progress["batch"], progress["copied"], last_id, _last_row())
        kills.append(at)
        return at

    with _processes(STREAM, DOCUMENTS, BATCH, tmp_path, runner) as (server, consumer):
        # (a) The progress record is started, the position not yet captured.
        server.gate("bootstrap")
        consumer.start()
        server.wait_gated("bootstrap", consumer)
        saved = store.find(STREAM)
        first = dict(saved.initial_sync)
        assert first["phase"] == "copying" and first["batch"] == 0, first
        assert first["last_id"] is None and first["copied"] == 0, first
        assert first["estimated"] == DOCUMENTS and first["reason"] == "first start", first
        assert saved.last_seen_token is None, "the position was persisted before the read"
        # Before any position is captured: only the copy can see these.
        unseen = server.write(docs.writes(20))
        assert unseen is not None
        kill("bootstrap")
        server.release("bootstrap")
        assert _copied() == [] and not MirrorDoc.objects.using("postgres").exists()

        # (b) Mid-copy, once four batches are committed.
        consumer.start()
        _copy_until(
            store,
            STREAM,
            lambda p: p["batch"] >= 1 + BATCHES_BEFORE_KILL,
            lambda p: server.write(docs.writes(8)),
            f"{BATCHES_BEFORE_KILL} committed batches of the second run",
            consumer,
            server,
        )
        time.sleep(rng.uniform(0, 0.2))  # anywhere in the next batch
        mid = kill("mid-copy")
        assert mid.batch >= 1 + BATCHES_BEFORE_KILL and mid.last_id is not None, mid
        captured = store.find(STREAM).last_seen_token
        assert captured is not None, "the second run did not persist its captured position"
        assert parse_token(captured)[0] >= unseen, "the copy started over at an old position"
        assert "initial sync (first start) starts at 0 of about" in consumer.run_log(2)
        restarted = _progress(store, STREAM)
        assert restarted["started_at"] == first["started_at"], "the restart lost started_at"
        assert restarted["reason"] == "first start"
        second_run = _copied(0, mid.last_row)
        assert second_run == sorted(second_run), "the copy did not deliver in _id order"
        assert len(set(second_run)) == len(second_run), "a document was copied twice in a run"
        committed = [key for key in second_run if key <= mid.last_id]
        assert len(committed) == mid.copied, (len(committed), mid)
        redelivered = len(second_run) - len(committed)
        assert redelivered <= BATCH, f"{redelivered} deliveries past the last committed batch"

        # While down: writes anywhere, then as many documents ahead of last_id as make
        # the rest a multiple of the batch size, so that the copy's last read is empty.
        server.write(docs.writes(20))
        padding = -len(docs.ids_in((mid.last_id + 1, float("inf")))) % BATCH
        server.write([docs.insert() for _ in range(padding)])
        rest = sorted(docs.ids_in((mid.last_id + 1, float("inf"))))
        assert rest and len(rest) % BATCH == 0

        # (c) Every batch committed, "done" not written. Meanwhile: writes behind
        # last_id, and updates ahead of it (the documents left to copy stay `rest`).
        server.gate("empty-find")
        consumer.start()
        behind: Range = (float("-inf"), mid.last_id)
        _copy_until(
            store,
            STREAM,
            lambda p: server.gated("empty-find"),
            lambda p: server.write(
                [*docs.writes(6, delete=behind, insert=("behind",)), docs.update(rng.choice(rest))]
            ),
            "the copy's last, empty read",
            consumer,
            server,
        )
        before_done = _progress(store, STREAM)
        assert before_done["phase"] == "copying", before_done
        assert decode_id(before_done["last_id"]) == rest[-1], before_done
        assert before_done["copied"] == mid.copied + len(rest), before_done
        assert store.find(STREAM).last_seen_token == captured, "the resume captured anew"
        server.write(docs.writes(15, insert=("behind",)))  # nothing new ahead of last_id
        end = kill("before done")
        server.release("empty-find")
        third_run = _copied(mid.last_row, end.last_row)
        assert third_run == rest, (
            "the resumed copy did not deliver exactly the documents after the last "
            f"committed batch: {len(third_run)} deliveries, {len(rest)} expected"
        )
        resumed = f"initial sync (first start) resumes at {mid.copied} of about"
        assert resumed in consumer.run_log(3), consumer.run_log(3)

        # (d) The copy is done; the stream opens after the captured position.
        server.gate("resume")
        consumer.start()
        server.wait_gated("resume", consumer)
        done = _progress(store, STREAM)
        assert done["phase"] == "done" and done["batch"] == before_done["batch"] + 1, done
        assert done["copied"] == before_done["copied"] and done["finished_at"], done
        assert store.find(STREAM).last_seen_token == captured
        server.write(docs.writes(20))
        opening = kill("stream opens")
        server.release("resume")

        # The last run streams every change made since the captured position.
        consumer.start()
        last_write = server.write(docs.writes(20))
        assert last_write is not None
        _catch_up(store, STREAM, last_write, consumer, server)
        assert consumer.terminate() == 0, consumer.log_tail()
        final = server.documents()
        errors = server.stop()
    assert not errors, errors[0]
    duration = time.monotonic() - started

    assert {doc["_id"]: doc for doc in final} == docs.docs, "the test's model drifted"
    _compare(_mirror(), final)
    assert _copied(end.last_row) == [], "the copy ran again after its last batch"
    assert opening.last_row == end.last_row
    progress = _progress(store, STREAM)
    assert progress == done, "the progress record changed after the copy"

    summary = _report(
        record_property,
        documents=DOCUMENTS,
        batch=BATCH,
        kills=len(kills),
        consumer_starts=consumer.starts,
        resumed_at=mid.copied,
        redelivered=redelivered,
        copied=done["copied"],
        writes=server.writes - padding,
        padding=padding,
        final_documents=len(final),
        seconds=round(duration, 1),
    )
    with capsys.disabled():
        print(f"\ninitial sync crash test [{STREAM}, {runner}]: {summary} mirror=exact seed={seed}")
        print(
            "  kills (point: batch/copied/last_id): "
            + ", ".join(f"{k.point}: {k.batch}/{k.copied}/{k.last_id}" for k in kills)
        )


# -- 2. transactional: SIGKILL mid-batch, no duplicate effect -------------------------- #


@dataclass(frozen=True)
class TxKill:
    """What the data said right after one SIGKILL of scenario 2."""

    batch: int
    copied: int
    last_id: Any
    rolled_back: int  # Effect ids handed out past the highest committed row


@pytest.mark.slow
@on_lane("postgres", databases=["default", "postgres"])
@pytest.mark.parametrize("runner", RUNNERS)
def test_transactional_copy_killed_mid_batch_has_no_duplicate_effect(
    runner, tmp_path, capsys, record_property
):
    """Three SIGKILLs inside a batch's transaction: each copied document has exactly
    one effect row, and the mirror equals the collection."""
    seed, rng = _seed_rng(record_property)
    record_property("runner", runner)
    db_name = connections["postgres"].settings_dict["NAME"]
    store = OrmCheckpointStore(using="postgres")
    assert not Effect.objects.using("postgres").exists()
    docs = Collection(TX_DOCUMENTS, rng)
    must_copy = set(docs.docs)  # gains the documents inserted ahead of the copy
    kills: list[TxKill] = []
    started = time.monotonic()

    def updates(progress: dict[str, Any]) -> None:
        server.write(docs.writes(6, delete=None, insert=()))

    with _processes(TRANSACTIONAL_STREAM, TX_DOCUMENTS, TX_BATCH, tmp_path, runner) as (
        server,
        consumer,
    ):
        consumer.start()
        base = 0
        while sum(1 for k in kills if k.rolled_back) < TX_MID_BATCH_KILLS:
            assert len(kills) < TX_MAX_KILLS, (
                f"{len(kills)} kills and only {sum(1 for k in kills if k.rolled_back)} "
                f"landed inside a batch: {kills}"
            )
            _copy_until(
                store,
                TRANSACTIONAL_STREAM,
                lambda p, base=base: p["batch"] >= base + 2,
                updates,
                f"two more committed batches before kill {len(kills) + 1}",
                consumer,
                server,
            )
            _wait_until(
                lambda: _open_write_transaction(db_name),
                PROGRESS_TIMEOUT,
                "an open batch transaction",
                consumer,
                server.proc,
            )
            time.sleep(rng.uniform(0, TX_KILL_JITTER_SECONDS))
            _kill(consumer, db_name)
            progress = _progress(store, TRANSACTIONAL_STREAM)
            assert progress["phase"] == "copying", f"the copy ended before kill {len(kills) + 1}"
            last_id = decode_id(progress["last_id"])
            rows = _copied()
            rolled_back = _effect_sequence() - _last_row()
            kills.append(TxKill(progress["batch"], progress["copied"], last_id, rolled_back))
            assert len(rows) == len(set(rows)) == progress["copied"], (
                f"after kill {len(kills)}: {len(rows)} rows ({len(set(rows))} documents) "
                f"for {progress['copied']} copied documents: a batch committed partly"
            )
            assert max(rows) == last_id, (max(rows), last_id)
            # While down: deletes behind the copy, inserts ahead of it, updates.
            ops = docs.writes(15, delete=(float("-inf"), last_id), insert=("ahead",))
            must_copy |= {op[1]["_id"] for op in ops if op[0] == "insert"}
            server.write(ops)
            base = progress["batch"]
            consumer.start()
        _copy_until(
            store,
            TRANSACTIONAL_STREAM,
            lambda p: p["phase"] == "done",
            updates,
            "the end of the copy",
            consumer,
            server,
        )
        last_write = server.write(docs.writes(30))
        assert last_write is not None
        _catch_up(store, TRANSACTIONAL_STREAM, last_write, consumer, server)
        assert consumer.terminate() == 0, consumer.log_tail()
        final = server.documents()
        errors = server.stop()
    assert not errors, errors[0]
    duration = time.monotonic() - started

    assert {doc["_id"]: doc for doc in final} == docs.docs, "the test's model drifted"
    _compare(_mirror(), final)
    rows = Counter(_copied())
    duplicates = sum(n - 1 for n in rows.values())
    missing = must_copy - set(rows)
    doubled = sorted(k for k, n in rows.items() if n > 1)
    assert duplicates == 0, f"{duplicates} duplicate effects, e.g. of documents {doubled[:10]}"
    assert not missing, f"{len(missing)} documents without their effect: {sorted(missing)[:10]}"
    assert set(rows) == must_copy, f"effects of documents never copied: {set(rows) - must_copy}"
    progress = _progress(store, TRANSACTIONAL_STREAM)
    assert progress["copied"] == len(must_copy), progress
    for start, kill in enumerate(kills, start=2):  # each restart resumed after its kill
        resumed = f"initial sync (first start) resumes at {kill.copied} of about"
        assert resumed in consumer.run_log(start), consumer.run_log(start)

    rolled_back = [k.rolled_back for k in kills]
    summary = _report(
        record_property,
        documents=TX_DOCUMENTS,
        batch=TX_BATCH,
        kills=len(kills),
        mid_batch_kills=sum(1 for n in rolled_back if n),
        duplicates=duplicates,
        missing=len(missing),
        effects=sum(rows.values()),
        writes=server.writes,
        final_documents=len(final),
        seconds=round(duration, 1),
    )
    with capsys.disabled():
        print(
            f"\ninitial sync crash test [{TRANSACTIONAL_STREAM}, {runner}]: {summary} mirror=exact "
            f"seed={seed}"
        )
        print(
            "  kills (batch/copied/rows rolled back): "
            + ", ".join(f"{k.batch}/{k.copied}/{k.rolled_back}" for k in kills)
        )


# -- 3. history lost mid-copy, on the wire --------------------------------------------- #


@pytest.fixture(scope="module")
def _scripted_rs() -> Iterator[Any]:
    from flowwarden_django.testkit.scripted_mongo import ScriptedReplicaSet

    with ScriptedReplicaSet() as srv:
        yield srv


@pytest.fixture
def scripted(_scripted_rs: Any) -> Iterator[Any]:
    """A fresh scripted replica set, the ``default`` Mongo client pointing at it."""
    _scripted_rs.reset()
    fw = {
        **settings.FLOWWARDEN,
        "MONGO_CLIENTS": {
            "default": {"URL": _scripted_rs.uri, "OPTIONS": {"serverSelectionTimeoutMS": 5000}}
        },
        "STREAM_MAX_AWAIT_MS": 50,
    }
    with override_settings(FLOWWARDEN=fw):
        yield _scripted_rs
    assert not _scripted_rs.internal_errors, _scripted_rs.internal_errors[0]


class SweepingMirror:
    """An idempotent in-memory mirror that, at the end of each copy, drops the rows that
    copy did not deliver: documents deleted while the history was lost leave no delete
    event, only their absence from the next copy."""

    def __init__(self) -> None:
        self.docs: dict[Any, dict[str, Any]] = {}
        self.this_copy: set[Any] = set()
        self.reasons: list[str] = []
        self.swept: list[set[Any]] = []
        self.copied: list[int] = []

    def on_started(self, sender: str, **kwargs: Any) -> None:
        self.this_copy = set()
        self.reasons.append(kwargs["reason"])

    def on_finished(self, sender: str, **kwargs: Any) -> None:
        stale = set(self.docs) - self.this_copy
        for key in stale:
            del self.docs[key]
        self.swept.append(stale)
        self.copied.append(kwargs["copied"])

    def on_snapshot(self, doc: Any) -> None:
        self.docs[doc["_id"]] = _fields(copy.deepcopy(dict(doc)))
        self.this_copy.add(doc["_id"])

    def on_insert(self, doc: Any) -> None:
        self.docs[doc["_id"]] = _fields(copy.deepcopy(dict(doc)))

    def on_update(self, ctx: Any) -> None:
        fields = self.docs.get(ctx.document_key["_id"])
        if fields is None:
            return
        fields.update(copy.deepcopy(dict(ctx.update_description.updated_fields)))
        for path in ctx.update_description.removed_fields:
            fields.pop(path, None)

    def on_delete(self, ctx: Any) -> None:
        self.docs.pop(ctx.document_key["_id"], None)

    @contextlib.contextmanager
    def listening(self) -> Iterator[None]:
        """Receive ``initial_sync_started`` / ``initial_sync_finished`` meanwhile."""
        metrics.initial_sync_started.connect(self.on_started)
        metrics.initial_sync_finished.connect(self.on_finished)
        try:
            yield
        finally:
            metrics.initial_sync_started.disconnect(self.on_started)
            metrics.initial_sync_finished.disconnect(self.on_finished)


def _wire_spec(handlers: dict[str, Any], on_history_lost: str) -> StreamSpec:
    return StreamSpec(
        name="orders",
        database="app",
        collection="orders",
        handlers=handlers,
        checkpoint=CheckpointSpec(
            start_position="COPY_EXISTING", copy_batch_size=400, on_history_lost=on_history_lost
        ),
        restart_policy=RestartPolicySpec(max_attempts=3, initial_delay="1ms", max_delay="5ms"),
    )


def test_wire_history_lost_mid_copy_resyncs(scripted, capsys, record_property):
    """The captured position leaves the oplog during the copy: RESYNC copies again,
    streams after the new position, and the mirror equals the collection."""
    _history_lost_mid_copy_resyncs(scripted, InMemoryCheckpointStore(), capsys, record_property)


@pytest.mark.django_db(transaction=True)
def test_wire_history_lost_mid_copy_resyncs_with_the_orm_store(scripted, capsys, record_property):
    """The same with the ORM checkpoint store (on the default SQLite database)."""
    _history_lost_mid_copy_resyncs(scripted, OrmCheckpointStore(), capsys, record_property)


def _history_lost_mid_copy_resyncs(
    scripted: Any, store: Any, capsys: Any, record_property: Callable[[str, Any], None]
) -> None:
    scripted.seed("app", "orders", [{"_id": i, "n": i, "k": "s"} for i in range(1, 3001)])
    mirror = SweepingMirror()
    seen: dict[str, Any] = {}

    def on_snapshot(doc: Any) -> None:
        mirror.on_snapshot(doc)
        count = len(mirror.this_copy)
        if len(mirror.reasons) == 1 and count == 1000:  # copy 1, batch 3
            seen["lost"] = store.find("orders").last_seen_token
            scripted.update("app", "orders", 5, {"n": -5, "x": 1})  # behind the copy
            scripted.update("app", "orders", 2500, {"n": -2500}, ["k"])  # ahead of it
            scripted.delete("app", "orders", 7)  # copied: its delete event is lost
            scripted.delete("app", "orders", 2600)  # never copied
            scripted.insert("app", "orders", {"_id": 0, "n": 0})  # behind: only copy 2
            scripted.insert("app", "orders", {"_id": 9000, "n": 9})  # ahead
            scripted.lose_history()
        elif len(mirror.reasons) == 2 and count == 500:  # copy 2: changes it streams
            scripted.update("app", "orders", 5, {"n": 55}, ["x"])  # behind
            scripted.update("app", "orders", 2700, {"y": 2})  # ahead
            scripted.delete("app", "orders", 8)  # behind: its delete event follows
            scripted.insert("app", "orders", {"_id": -1, "n": -1})  # behind
            scripted.insert("app", "orders", {"_id": 9500, "n": 95})  # ahead

    handlers = {**_handlers(mirror), "snapshot": on_snapshot}
    consumer = StreamConsumer(_wire_spec(handlers, "RESYNC"), store, pymongo_source)
    with mirror.listening():
        consumer.run(burst=True)
    final = scripted.documents("app", "orders")

    assert consumer.state == StreamState.STOPPED, consumer.last_error
    _compare(mirror.docs, final)
    assert mirror.reasons == ["first start", "history lost"], mirror.reasons
    assert mirror.swept == [set(), {7}], mirror.swept  # only the lost delete needed it
    assert consumer.documents_copied == sum(mirror.copied)
    # Copy 1: 3,000 seeded - 2600 (deleted ahead) + 9000 (inserted ahead); copy 2: the
    # 3,000 documents then, + 9500 (inserted ahead during it).
    assert mirror.copied == [3000, 3001], mirror.copied
    saved = store.find("orders")
    progress = saved.initial_sync
    assert progress["phase"] == "done" and progress["reason"] == "history lost", progress
    # Copy 1: start (0), 8 batches of 400 (the last one short: no empty read), done (9);
    # copy 2 goes on from there: start (10), 8 batches, done (19).
    assert progress["batch"] == 19, progress
    assert seen["lost"] is not None and saved.last_seen_token != seen["lost"]
    resumes = [
        c["pipeline"][0]["$changeStream"].get("resumeAfter")
        for c in scripted.commands("aggregate")
        if "$changeStream" in c["pipeline"][0]
    ]
    assert resumes.count(seen["lost"]) == 1, "the lost position was not tried exactly once"
    with capsys.disabled():
        print(
            f"\ninitial sync history lost mid-copy [RESYNC, {type(store).__name__}]: "
            + _report(
                record_property,
                copies=len(mirror.reasons),
                first_copy=mirror.copied[0],
                second_copy=mirror.copied[1],
                swept=sum(len(s) for s in mirror.swept),
                final_documents=len(final),
            )
            + " mirror=exact"
        )


def test_wire_history_lost_mid_copy_fails_under_fail(scripted):
    """Under FAIL the consumer stops with HistoryLostError once the copy is done."""
    scripted.seed("app", "orders", [{"_id": i, "n": i} for i in range(1, 1001)])
    store = InMemoryCheckpointStore()
    mirror = SweepingMirror()

    def on_snapshot(doc: Any) -> None:
        mirror.on_snapshot(doc)
        if doc["_id"] == 500:
            scripted.insert("app", "orders", {"_id": 5000, "n": 5})
            scripted.lose_history()

    consumer = StreamConsumer(
        _wire_spec({**_handlers(mirror), "snapshot": on_snapshot}, "FAIL"), store, pymongo_source
    )
    with pytest.raises(HistoryLostError):
        consumer.run(burst=True)
    assert consumer.state == StreamState.CRASHED
    _compare(mirror.docs, scripted.documents("app", "orders"))  # the copy itself completed
    progress = store.find("orders").initial_sync
    assert progress["phase"] == "done" and progress["reason"] == "first start", progress


def _handlers(mirror: SweepingMirror) -> dict[str, Any]:
    return {"insert": mirror.on_insert, "update": mirror.on_update, "delete": mirror.on_delete}
