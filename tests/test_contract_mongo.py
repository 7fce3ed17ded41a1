"""The contract suite on the MongoDB store: mongomock always, a live replica set on demand.

mongomock is an in-process fake of pymongo: it proves the store's queries and
documents, not the server's behaviour under concurrent writers. The live lane
(``FLOWWARDEN_TEST_MONGO_URL``) runs the same suite on a real server.
"""

import os
import uuid

import pytest

from flowwarden_django.streams.backends.mongo import MongoCheckpointStore
from flowwarden_django.testkit import CheckpointStoreContract
from flowwarden_django.testkit.checkpoint_store import now_ms, token
from tests.lanes import on_lane

mongomock = pytest.importorskip("mongomock")


class TestMongoCheckpointStoreOnMongomock(CheckpointStoreContract):
    """Reported as mongomock: a fake, not a MongoDB server."""

    def make_store(self):
        return MongoCheckpointStore(client=mongomock.MongoClient(), database="fwtest")


@on_lane("mongo_live")
class TestMongoCheckpointStoreLive(CheckpointStoreContract):
    def make_store(self):
        return MongoCheckpointStore(
            url=os.environ["FLOWWARDEN_TEST_MONGO_URL"],
            database="fwtest",
            collection=f"_fw_checkpoints_{uuid.uuid4().hex[:8]}",
        )


class TestMongoSpecifics:
    @pytest.fixture
    def store(self):
        return MongoCheckpointStore(client=mongomock.MongoClient(), database="fwtest")

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

    def test_url_needs_exactly_one_connection(self):
        with pytest.raises(TypeError):
            MongoCheckpointStore()
        with pytest.raises(TypeError):
            MongoCheckpointStore(url="mongodb://x", client=mongomock.MongoClient())
