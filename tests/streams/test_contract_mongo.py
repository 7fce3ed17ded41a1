"""The contract suite on the MongoDB store: mongomock always, a live replica set on demand.

mongomock is an in-process fake of pymongo: it proves the store's queries and
documents, not the server's behaviour under concurrent writers. The live lane
(``FLOWWARDEN_TEST_MONGO_URL``) runs the same suite on a real server.
"""

import functools
import os
import uuid

import mongomock
import pytest

from flowwarden_django.streams.backends.mongo import MongoCheckpointStore
from flowwarden_django.testkit import AsyncCheckpointStoreContract, CheckpointStoreContract
from flowwarden_django.testkit.checkpoint_store import now_ms, sync_progress, token
from tests.streams.async_mongomock import MONGOMOCK_LOCK, NativeAsyncOnly, NativeOnMongomock
from tests.support.lanes import on_lane


class SerializedCollection:
    """A mongomock collection used by one thread at a time.

    mongomock is not thread-safe (its dicts change while other threads iterate
    them). The race tests then check the store's logic, not real concurrency:
    that needs the live lane.
    """

    def __init__(self, collection):
        self._collection = collection
        self._lock = MONGOMOCK_LOCK  # the async adapter's too

    def __getattr__(self, name):
        attribute = getattr(self._collection, name)
        if not callable(attribute):
            return attribute

        @functools.wraps(attribute)
        def serialized(*args, **kwargs):
            with self._lock:
                result = attribute(*args, **kwargs)
                return list(result) if name == "find" else result

        return serialized


class MongomockStore(MongoCheckpointStore):
    def _open(self):
        return SerializedCollection(super()._open())

    def list_checkpoints(self):
        documents = sorted(self.collection.find({}), key=lambda doc: doc["_id"])
        return [self._to_checkpoint(doc) for doc in documents]


class TestMongoCheckpointStoreOnMongomock(CheckpointStoreContract):
    """Reported as mongomock: a fake, not a MongoDB server."""

    def make_store(self):
        return MongomockStore(client=mongomock.MongoClient(), database="fwtest")


@on_lane("mongo_live")
class TestMongoCheckpointStoreLive(CheckpointStoreContract):
    def make_store(self):
        return MongoCheckpointStore(
            url=os.environ["FLOWWARDEN_TEST_MONGO_URL"],
            database="fwtest",
            collection=f"_fw_checkpoints_{uuid.uuid4().hex[:8]}",
        )

    def teardown_store(self, store):
        store.collection.drop()
        store.close()


class TestMongoSpecifics:
    @pytest.fixture
    def store(self):
        return MongoCheckpointStore(client=mongomock.MongoClient(), database="fwtest")

    def test_guard_on_a_document_without_the_key(self, store):
        """A document in the reference layout (no lastProcessedKey) is guarded on the token."""
        now = now_ms()
        store.collection.insert_one({"_id": "old", "lastProcessedToken": token("dead")})
        store.reset_after_history_lost("old", token("fresh"), None, now)
        assert store.find("old").last_processed_token == token("dead")
        store.reset_after_history_lost("old", token("fresh"), token("other"), now)
        assert store.find("old").last_processed_token == token("dead")
        store.reset_after_history_lost("old", token("fresh"), token("dead"), now)
        assert store.find("old").last_processed_token is None

    @pytest.mark.parametrize("expected", ["dead", "other"], ids=["guard-match", "guard-mismatch"])
    def test_reset_keeps_unknown_fields(self, store, expected):
        now = now_ms()
        store.save_processed("s", token("dead"), now)
        store.collection.update_one({"_id": "s"}, {"$set": {"customField": "keep me"}})
        store.reset_after_history_lost("s", token("fresh"), token(expected), now)
        document = store.collection.find_one({"_id": "s"})
        assert document["customField"] == "keep me"
        assert ("lastProcessedToken" in document) is (expected != "dead")

    def test_layout_matches_the_reference(self, store):
        now = now_ms()
        store.save_processed("orders", token("8263"), now, now)
        document = store.collection.find_one({"_id": "orders"})
        assert store.collection.name == "_fw_checkpoints"
        assert document["lastProcessedToken"] == {"_data": "8263"}
        assert set(document) == {
            "_id",
            "lastProcessedToken",
            "lastProcessedKey",
            "lastProcessedTimestamp",
            "lastHeartbeatTimestamp",
        }

    def test_initial_sync_layout_and_unknown_fields(self, store):
        store.save_processed("orders", token("8263"), now_ms())
        store.collection.update_one({"_id": "orders"}, {"$set": {"customField": "keep me"}})
        assert store.save_initial_sync("orders", sync_progress(12), expected_batch=None)
        document = store.collection.find_one({"_id": "orders"})
        assert document["initialSync"] == sync_progress(12)
        assert document["customField"] == "keep me"
        assert store.save_initial_sync("orders", None, expected_batch=12)
        document = store.collection.find_one({"_id": "orders"})
        assert "initialSync" not in document
        assert document["customField"] == "keep me"

    def test_a_null_initial_sync_is_no_progress(self, store):
        """A document holding ``initialSync: null`` (written by hand) has no progress."""
        store.collection.insert_one({"_id": "orders", "initialSync": None})
        assert store.find("orders").initial_sync is None
        assert not store.save_initial_sync("orders", sync_progress(1), expected_batch=0)
        assert store.save_initial_sync("orders", sync_progress(0), expected_batch=None)
        assert store.find("orders").initial_sync == sync_progress(0)

    def test_clearing_a_missing_record_creates_a_bare_document(self, store):
        assert store.save_initial_sync("orders", None, expected_batch=None)
        assert store.collection.find_one({"_id": "orders"}) == {"_id": "orders"}

    @pytest.mark.parametrize(
        ("existing", "written"),
        [({}, True), ({"initialSync": {"batch": 7}}, False)],
        ids=["created-without-progress", "created-with-progress"],
    )
    def test_a_duplicate_key_on_the_upsert_decides_on_the_record(
        self, store, existing, written, monkeypatch
    ):
        """The upsert's filter missed, then another writer created the record: the
        duplicate-key error is not the answer; the update without upsert is."""
        from pymongo.errors import DuplicateKeyError

        collection = store.collection
        real_update_one = collection.update_one
        calls = []

        def racing_update_one(filter, update, upsert=False, **kwargs):
            calls.append(upsert)
            if upsert:
                collection.insert_one({"_id": filter["_id"], **existing})
                raise DuplicateKeyError("E11000 duplicate key error", 11000)
            return real_update_one(filter, update, upsert=upsert, **kwargs)

        monkeypatch.setattr(collection, "update_one", racing_update_one)
        assert store.save_initial_sync("orders", sync_progress(0), expected_batch=None) is written
        assert calls == [True, False]
        expected = sync_progress(0) if written else {"batch": 7}
        assert store.find("orders").initial_sync == expected

    def test_url_needs_exactly_one_connection(self):
        with pytest.raises(TypeError):
            MongoCheckpointStore()
        with pytest.raises(TypeError):
            MongoCheckpointStore(url="mongodb://x", client=mongomock.MongoClient())


# -- the same through the async API ----------------------------------------------------


class TestMongoCheckpointStoreOnMongomockAsync(
    AsyncCheckpointStoreContract, TestMongoCheckpointStoreOnMongomock
):
    """A ready (mongomock) ``client``: the thread-based fallback. Reported as mongomock:
    a fake, not a MongoDB server."""


class NativeMongomockStore(NativeOnMongomock, MongomockStore):
    pass


class TestMongoCheckpointStoreOnMongomockNativeAsync(
    NativeAsyncOnly, AsyncCheckpointStoreContract, TestMongoCheckpointStoreOnMongomock
):
    """The native path, on mongomock behind the async API (``async_mongomock``)."""

    def make_store(self):
        return NativeMongomockStore(client=mongomock.MongoClient(), database="fwtest")


class TestMongoCheckpointStoreLiveAsync(
    NativeAsyncOnly, AsyncCheckpointStoreContract, TestMongoCheckpointStoreLive
):
    """The native path (an ``AsyncMongoClient`` from the url) on a live server."""
