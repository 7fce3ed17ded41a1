"""The scripted replica set takes the real driver's writes (``insert``, ``update``,
``delete``, ``findAndModify``), which its change streams see, and refuses what it does
not support with a clear error; ``manage.py flowwarden_mongo_dev`` serves it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mockupdb", reason="the scripted MongoDB fake needs mockupdb==1.8.1")

import pymongo
from pymongo.errors import DuplicateKeyError, OperationFailure

from flowwarden_django.testkit.scripted_mongo import ScriptedReplicaSet
from tests.support.services import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def _server() -> Iterator[ScriptedReplicaSet]:
    with ScriptedReplicaSet() as server:
        yield server


@pytest.fixture
def rs(_server: ScriptedReplicaSet) -> Iterator[ScriptedReplicaSet]:
    _server.reset()
    yield _server
    assert not _server.internal_errors, _server.internal_errors[0]


@pytest.fixture
def coll(rs: ScriptedReplicaSet) -> Iterator[Any]:
    client: pymongo.MongoClient = pymongo.MongoClient(rs.uri, serverSelectionTimeoutMS=5000)
    try:
        yield client.app.orders
    finally:
        client.close()


def test_the_driver_s_writes_become_change_events(rs, coll):
    with coll.watch() as stream:
        coll.insert_one({"_id": 1, "n": 1, "tags": {"vip": False}})
        coll.insert_many([{"_id": 2, "n": 2}, {"_id": 3, "n": 3}])
        assert coll.update_one({"_id": 1}, {"$set": {"tags.vip": True}, "$inc": {"n": 10}})
        changed = coll.update_many({"n": {"$lte": 3}}, {"$unset": {"n": ""}})
        assert (changed.matched_count, changed.modified_count) == (2, 2)
        assert coll.replace_one({"_id": 3}, {"state": "new"}).modified_count == 1
        after = coll.find_one_and_update(
            {"_id": 2}, {"$set": {"x": 1}}, return_document=pymongo.ReturnDocument.AFTER
        )
        assert after == {"_id": 2, "x": 1}
        assert coll.find_one_and_delete({"_id": 3}) == {"_id": 3, "state": "new"}
        assert coll.delete_many({}).deleted_count == 2
        events = [stream.next() for _ in range(10)]
    kinds = [(e["operationType"], e["documentKey"]["_id"]) for e in events]
    # In the writes' order (update_many's and delete_many's in insertion order).
    assert kinds == [
        ("insert", 1),
        ("insert", 2),
        ("insert", 3),
        ("update", 1),
        ("update", 2),
        ("update", 3),
        ("replace", 3),
        ("update", 2),
        ("delete", 3),
        ("delete", 1),
    ]
    assert events[3]["updateDescription"]["updatedFields"] == {"tags.vip": True, "n": 11}
    assert rs.documents("app", "orders") == []


def test_what_it_does_not_support_is_refused_not_answered_wrongly(rs, coll):
    coll.insert_one({"_id": 1, "n": "one"})
    with pytest.raises(DuplicateKeyError):
        coll.insert_one({"_id": 1})
    for call, words in [
        (lambda: coll.update_one({"_id": 1}, {"$push": {"a": 1}}), "the update operator $push"),
        (lambda: coll.update_one({"_id": 9}, {"$set": {"a": 1}}, upsert=True), "upsert"),
        (lambda: coll.update_one({"_id": 1}, [{"$set": {"a": 1}}]), "aggregation pipeline"),
        (lambda: coll.update_one({"_id": 1}, {"$inc": {"n": 1}}), "non-number"),
        (lambda: coll.update_one({"_id": 1}, {"$set": {"_id": 2}}), "_id"),
    ]:
        with pytest.raises(OperationFailure) as refused:
            call()
        assert words in refused.value.details["errmsg"], refused.value.details
    assert rs.documents("app", "orders") == [{"_id": 1, "n": "one"}]
    # The Python API refuses an update document where it takes field paths.
    with pytest.raises(ValueError, match="takes field paths, not an update document"):
        rs.update("app", "orders", 1, {"$set": {"x": 1}})
    assert rs.documents("app", "orders") == [{"_id": 1, "n": "one"}]


@pytest.mark.subprocess
def test_the_dev_command_serves_seeded_documents_and_takes_writes(tmp_path):
    seed = tmp_path / "orders.json"
    seed.write_text('{"_id": 1, "total": 10}\n{"_id": {"$oid": "65a1b2c3d4e5f60000000001"}}\n')
    port = free_port()
    command = [
        sys.executable,
        "manage.py",
        "flowwarden_mongo_dev",
        "--port",
        str(port),
        "--seed",
        str(seed),
    ]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        lines = []
        deadline = time.monotonic() + 60
        while not any("Development MongoDB" in line for line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            lines.append(proc.stdout.readline())
        assert "Seeded 2 document(s) into app.orders." in "".join(lines)
        uri = lines[-1].split(" at ", 1)[1].strip()
        with pymongo.MongoClient(uri, serverSelectionTimeoutMS=5000) as client:
            orders = client.app.orders
            assert orders.count_documents({}) == 2
            orders.insert_one({"_id": 2, "total": 20})
            assert orders.find_one({"_id": 2}) == {"_id": 2, "total": 20}
    finally:
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, out
    assert "Stopped; its data is gone." in out


def test_the_dev_command_names_what_is_wrong_with_its_seed(tmp_path):
    from django.core.management import CommandError, call_command

    bad = tmp_path / "bad.json"
    bad.write_text("[{nope")
    with pytest.raises(CommandError, match=r"is not JSON .* a JSON array of documents"):
        call_command("flowwarden_mongo_dev", "--seed", str(bad), "--port", str(free_port()))
    scalars = tmp_path / "scalars.json"
    scalars.write_text(json.dumps([1, 2]))
    with pytest.raises(CommandError, match="every item must be a document"):
        call_command("flowwarden_mongo_dev", "--seed", str(scalars), "--port", str(free_port()))
