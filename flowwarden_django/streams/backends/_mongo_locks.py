"""Lock service on MongoDB, in the reference's ``_fw_locks`` collection plus a token.

Document: ``{_id: name, instanceId, token, acquiredAt, expiresAt}`` (dates in
whole milliseconds). A release unsets ``instanceId`` and sets ``expiresAt`` to the
epoch; the document stays, so tokens never restart.

Acquire is ONE ``find_one_and_update`` with ``upsert=True``, filtered on
``{_id, $or: [{instanceId: me}, {expiresAt: {$lte: now}}, {instanceId: null}]}``,
whose update is a pipeline: one ``$set`` stage computes the token (``+1`` unless
the caller still validly holds the lease) and ``acquiredAt`` from the document as
it was, then sets owner and expiry. When another owner holds an unexpired lease
the filter matches nothing and the upsert's insert collides on ``_id``: that
``DuplicateKeyError`` means "not acquired", as in the reference. Renew and
release are single ``update_one`` calls guarded by owner, token and expiry.

Update pipelines need MongoDB 4.2 or later. The tests run this backend on
mongomock (which evaluates the same pipeline) and, when
``FLOWWARDEN_TEST_MONGO_URL`` is set, on a real server.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core import checks
from django.utils import timezone

from ..checkpoint import as_utc
from ..locks import Lease, LockService, ttl_delta
from ._lock_common import check_owner, renamed_checks, warn_unavailable
from ._mongo_common import MongoCollection, check_connection_options

DEFAULT_COLLECTION = "_fw_locks"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _ms(value: datetime) -> datetime:
    """*value* truncated to whole milliseconds, the precision of BSON dates."""
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


def _acquire_update(owner: str, now: datetime, expires_at: datetime) -> list[dict[str, Any]]:
    """The acquire pipeline: in one ``$set`` stage every expression reads the old document."""
    still_ours = {"$and": [{"$eq": ["$instanceId", owner]}, {"$gt": ["$expiresAt", now]}]}
    return [
        {
            "$set": {
                "token": {
                    "$cond": [still_ours, "$token", {"$add": [{"$ifNull": ["$token", 0]}, 1]}]
                },
                "acquiredAt": {"$cond": [still_ours, "$acquiredAt", now]},
                "instanceId": owner,
                "expiresAt": expires_at,
            }
        }
    ]


class MongoLockService(MongoCollection, LockService):
    """Leases in a MongoDB collection (``_fw_locks`` by default).

    Options as ``MongoCheckpointStore``: a ``url`` (its default database is used
    unless ``database`` is given) or a ready pymongo-compatible ``client``; writes
    use ``w="majority"`` unless ``write_concern`` says otherwise (a lease written
    to a minority could be lost in a failover and granted twice).
    """

    #: The async API runs on the default executor, in parallel: this never touches
    #: the Django database.
    async_thread_sensitive = False

    def __init__(
        self,
        url: str | None = None,
        client: Any = None,
        database: str | None = None,
        collection: str = DEFAULT_COLLECTION,
        write_concern: str | int = "majority",
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        MongoCollection.__init__(
            self, url, client, database, collection, write_concern, client_options
        )

    @staticmethod
    def _held(lease: Lease, now: datetime) -> dict[str, Any]:
        """A filter true while *lease* is the current one."""
        return {
            "_id": lease.name,
            "instanceId": lease.owner,
            "token": lease.token,
            "expiresAt": {"$gt": now},
        }

    # -- the SPI -----------------------------------------------------------------

    def try_acquire(self, name: str, owner: str, ttl: timedelta | float) -> Lease | None:
        from pymongo import ReturnDocument
        from pymongo.errors import DuplicateKeyError, PyMongoError

        check_owner(owner)
        delta = ttl_delta(ttl)
        now = _ms(timezone.now())
        expires_at = _ms(now + delta)
        takeable = {
            "_id": name,
            "$or": [{"instanceId": owner}, {"expiresAt": {"$lte": now}}, {"instanceId": None}],
        }
        try:
            document = self.collection.find_one_and_update(
                takeable,
                _acquire_update(owner, now, expires_at),
                upsert=True,
                return_document=ReturnDocument.AFTER,
            )
        except DuplicateKeyError:
            return None  # held by another owner (or a concurrent first acquire won)
        except PyMongoError as error:
            warn_unavailable("acquire", name, error)
            return None
        return self._to_lease(document)

    def renew(self, lease: Lease, ttl: timedelta | float) -> Lease | None:
        from pymongo.errors import PyMongoError

        delta = ttl_delta(ttl)
        now = _ms(timezone.now())
        expires_at = _ms(now + delta)
        try:
            result = self.collection.update_one(
                self._held(lease, now), {"$set": {"expiresAt": expires_at}}
            )
        except PyMongoError as error:
            warn_unavailable("renewal", lease.name, error)
            return None
        if result.matched_count != 1:
            return None
        return Lease(lease.name, lease.owner, lease.token, lease.acquired_at, expires_at)

    def release(self, lease: Lease) -> bool:
        result = self.collection.update_one(
            self._held(lease, _ms(timezone.now())),
            {"$unset": {"instanceId": ""}, "$set": {"expiresAt": _EPOCH}},
        )
        return result.matched_count == 1

    def owner_of(self, name: str) -> Lease | None:
        document = self.collection.find_one(
            {"_id": name, "instanceId": {"$ne": None}, "expiresAt": {"$gt": _ms(timezone.now())}}
        )
        return None if document is None else self._to_lease(document)

    @staticmethod
    def _to_lease(document: Mapping[str, Any]) -> Lease:
        return Lease(
            name=document["_id"],
            owner=document["instanceId"],
            token=int(document["token"]),
            acquired_at=as_utc(document["acquiredAt"]),
            expires_at=as_utc(document["expiresAt"]),
        )

    # -- configuration checks ----------------------------------------------------

    @classmethod
    def check_options(cls, alias: str, options: Mapping[str, Any]) -> list[checks.CheckMessage]:
        """The same checks as ``MongoCheckpointStore``, named for ``LOCK_SERVICES``."""
        return renamed_checks(check_connection_options, cls, alias, options)
