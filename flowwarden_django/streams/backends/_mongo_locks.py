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

The async operations are native: the same filters and updates (built once, by the
helpers below) on pymongo's ``AsyncMongoClient``, one per running event loop (see
:meth:`MongoCollection.async_collection`).

Update pipelines need MongoDB 4.2 or later. The tests run this backend on
mongomock (which evaluates the same pipeline) and, when
``FLOWWARDEN_TEST_MONGO_URL`` is set, on a real server.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core import checks
from django.utils import timezone

from ..checkpoint import as_utc
from ..locks import Lease, ttl_delta
from ..stores import lock_services
from ._calls import Operation, call
from ._lock_common import check_owner, warn_unavailable
from ._mongo_common import MongoCollection, mongo_option_checks
from ._native_locks import NativeLockService

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


def _acquire(name: str, owner: str, ttl: timedelta | float) -> tuple[Any, ...]:
    """The arguments of the acquire's ``find_one_and_update``: filter, update, options."""
    from pymongo import ReturnDocument

    check_owner(owner)
    delta = ttl_delta(ttl)
    now = _ms(timezone.now())
    takeable = {
        "_id": name,
        "$or": [{"instanceId": owner}, {"expiresAt": {"$lte": now}}, {"instanceId": None}],
    }
    update = _acquire_update(owner, now, _ms(now + delta))
    return takeable, update, {"upsert": True, "return_document": ReturnDocument.AFTER}


def _held(lease: Lease, now: datetime) -> dict[str, Any]:
    """A filter true while *lease* is the current one."""
    return {
        "_id": lease.name,
        "instanceId": lease.owner,
        "token": lease.token,
        "expiresAt": {"$gt": now},
    }


def _renewal(lease: Lease, ttl: timedelta | float) -> tuple[dict[str, Any], dict[str, Any], Lease]:
    """The renewal's ``update_one`` (filter and update) and the lease it makes."""
    delta = ttl_delta(ttl)
    now = _ms(timezone.now())
    renewed = Lease(lease.name, lease.owner, lease.token, lease.acquired_at, _ms(now + delta))
    return _held(lease, now), {"$set": {"expiresAt": renewed.expires_at}}, renewed


def _release(lease: Lease) -> tuple[dict[str, Any], dict[str, Any]]:
    """The release's ``update_one``: the owner unset, the expiry at the epoch."""
    update = {"$unset": {"instanceId": ""}, "$set": {"expiresAt": _EPOCH}}
    return _held(lease, _ms(timezone.now())), update


def _unexpired(name: str) -> dict[str, Any]:
    """The filter of ``owner_of``: a held, unexpired lease on *name*."""
    return {"_id": name, "instanceId": {"$ne": None}, "expiresAt": {"$gt": _ms(timezone.now())}}


def _current(lease: Lease) -> dict[str, Any]:
    """The filter of ``is_current``."""
    return _held(lease, _ms(timezone.now()))


@contextlib.contextmanager
def _errors_as_not_held(operation: str, name: str) -> Iterator[None]:
    """Around an acquire or a renewal: a duplicate key (another owner's lease) ends the
    block quietly, any other pymongo error with a warning; the result stays ``None``."""
    from pymongo.errors import DuplicateKeyError, PyMongoError

    try:
        yield
    except DuplicateKeyError:
        pass  # held by another owner (or a concurrent first acquire won)
    except PyMongoError as error:
        warn_unavailable(operation, name, error)


class MongoLockService(MongoCollection, NativeLockService):
    """Leases in a MongoDB collection (``_fw_locks`` by default).

    Options as ``MongoCheckpointStore``: a ``url`` (its default database is used
    unless ``database`` is given) or a ready pymongo-compatible ``client``; writes
    use ``w="majority"`` unless ``write_concern`` says otherwise (a lease written
    to a minority could be lost in a failover and granted twice).

    The async operations are native, on pymongo's ``AsyncMongoClient`` (one per
    running event loop, made from ``url`` and ``client_options``) with the same
    filters and updates; given a ready ``client``, they fall back to the default
    (the sync operation on the default executor).
    """

    default_collection = DEFAULT_COLLECTION

    # -- the store operations, each run by the sync and the async API --------------

    def _try_acquire_operation(
        self, name: str, owner: str, ttl: timedelta | float
    ) -> Operation[Lease | None]:
        takeable, update, options = _acquire(name, owner, ttl)
        document = None
        with _errors_as_not_held("acquire", name):
            document = yield call("find_one_and_update", takeable, update, **options)
        return None if document is None else self._to_lease(document)

    def _renew_operation(self, lease: Lease, ttl: timedelta | float) -> Operation[Lease | None]:
        held, update, renewed = _renewal(lease, ttl)
        matched = 0
        with _errors_as_not_held("renewal", lease.name):
            matched = (yield call("update_one", held, update)).matched_count
        return renewed if matched == 1 else None

    def _release_operation(self, lease: Lease) -> Operation[bool]:
        return (yield call("update_one", *_release(lease))).matched_count == 1

    def _owner_of_operation(self, name: str) -> Operation[Lease | None]:
        document = yield call("find_one", _unexpired(name))
        return None if document is None else self._to_lease(document)

    def _is_current_operation(self, lease: Lease) -> Operation[bool]:
        return (yield call("find_one", _current(lease), {"_id": 1})) is not None

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
        return mongo_option_checks(lock_services.alias_setting(alias), cls.__name__, options)
