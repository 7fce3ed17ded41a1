"""Lock service on the Django database, through the ``StreamLease`` model.

Each operation is ONE conditional SQL statement, so it is atomic without an
explicit transaction:

* ``try_acquire``: an upsert (``INSERT … ON CONFLICT (name) DO UPDATE … WHERE …
  RETURNING`` on PostgreSQL and SQLite, ``INSERT … ON DUPLICATE KEY UPDATE …
  RETURNING`` on MariaDB) that takes the row only when it is free, expired or the
  caller's, and adds one to the fencing token only when a new tenure starts.
  MySQL has no ``RETURNING``: there the upsert is followed by a read of the row
  on the same connection (see :meth:`OrmLockService._acquire_then_read`).
* ``renew``: ``UPDATE … SET expires_at WHERE name, owner, token match AND
  expires_at > now``.
* ``release``: the same guarded ``UPDATE``, clearing ``owner`` and
  ``expires_at``; the row stays, so tokens never restart.

Times come from ``timezone.now()`` on the calling host and are passed as
parameters: hosts sharing a lease need synchronized clocks (NTP), as in the
reference. Call these methods outside ``transaction.atomic()``: inside one, the
upsert holds the lease row locked until the caller's transaction ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from django.core import checks
from django.db import Error, transaction
from django.utils import timezone

from ...common.sql import KEPT_CURSOR, QUOTES, kept_cursor
from ...models import StreamLease
from ..locks import Lease, LeaseLostError, LockService, ttl_delta
from ..stores import lock_services
from ._extras import check_using
from ._lock_common import check_owner, warn_unavailable
from ._orm_common import OnDatabase

_COLUMNS = ("name", "owner", "token", "acquired_at", "expires_at")


@lru_cache(maxsize=8)
def _acquire_sql(vendor: str, returning: bool) -> str:
    """The acquire upsert for *vendor*; parameters: name, owner, now, expires_at.

    The inserted ``acquired_at`` is the caller's "now", so the conflict branch
    compares expiry against it instead of taking the time twice.
    """
    q = QUOTES[vendor]
    table = q(StreamLease._meta.db_table)
    name, owner, token, acquired, expires = (q(c) for c in _COLUMNS)
    insert = (
        f"INSERT INTO {table} ({name}, {owner}, {token}, {acquired}, {expires}) "
        "VALUES (%s, %s, 1, %s, %s) "
    )
    if vendor == "mysql":
        new = "VALUES({})".format
        # A new tenure: the row is free, or its holder's lease has lapsed.
        tenure = f"({owner} = '' OR {expires} IS NULL OR {expires} <= {new(acquired)})"
        ours = f"({tenure} OR {owner} = {new(owner)})"
        # MySQL/MariaDB apply these left to right, each seeing the earlier new
        # values: token and acquired_at read the old owner and expiry, owner reads
        # the old expiry, and expires_at reads the new owner (ours if we took it).
        sql = insert + (
            "ON DUPLICATE KEY UPDATE "
            f"{token} = IF({tenure}, {token} + 1, {token}), "
            f"{acquired} = IF({tenure}, {new(acquired)}, {acquired}), "
            f"{owner} = IF({ours}, {new(owner)}, {owner}), "
            f"{expires} = IF({owner} = {new(owner)}, {new(expires)}, {expires})"
        )
    else:
        old = f"{table}."
        tenure = (
            f"({old}{owner} = '' OR {old}{expires} IS NULL "
            f"OR {old}{expires} <= EXCLUDED.{acquired})"
        )
        sql = insert + (
            f"ON CONFLICT ({name}) DO UPDATE SET "
            f"{token} = CASE WHEN {tenure} THEN {old}{token} + 1 ELSE {old}{token} END, "
            f"{acquired} = CASE WHEN {tenure} THEN EXCLUDED.{acquired} ELSE {old}{acquired} END, "
            f"{owner} = EXCLUDED.{owner}, {expires} = EXCLUDED.{expires} "
            f"WHERE {tenure} OR {old}{owner} = EXCLUDED.{owner}"
        )
    if returning:
        sql += f" RETURNING {owner}, {token}, {acquired}, {expires}"
    return sql


#: SET clauses as (column, value) pairs; ``{column}`` in a value is the column itself.
Assignments = tuple[tuple[str, str], ...]
_RENEW: Assignments = (("expires_at", "%s"),)
_RELEASE: Assignments = (("owner", "''"), ("expires_at", "NULL"))
_TOUCH: Assignments = (("token", "{column}"),)


@lru_cache(maxsize=16)
def _guarded_update_sql(vendor: str, assignments: Assignments) -> str:
    """An ``UPDATE`` of one lease still held. Parameters: those of *assignments*,
    then name, owner, token and now."""
    q = QUOTES[vendor]
    sets = ", ".join(f"{q(c)} = {value.format(column=q(c))}" for c, value in assignments)
    name, owner, token, _, expires = (q(c) for c in _COLUMNS)
    return (
        f"UPDATE {q(StreamLease._meta.db_table)} SET {sets} "
        f"WHERE {name} = %s AND {owner} = %s AND {token} = %s AND {expires} > %s"
    )


@lru_cache(maxsize=4)
def _locking_read_sql(vendor: str) -> str:
    """Lock the row of a lease still held. Parameters: name, owner, token and now."""
    q = QUOTES[vendor]
    name, owner, token, _, expires = (q(c) for c in _COLUMNS)
    return (
        f"SELECT 1 FROM {q(StreamLease._meta.db_table)} "
        f"WHERE {name} = %s AND {owner} = %s AND {token} = %s AND {expires} > %s FOR UPDATE"
    )


class OrmLockService(OnDatabase, LockService):
    """Leases in the ``StreamLease`` table of a Django database.

    ``using`` pins a database alias; by default the router's ``db_for_write``
    chooses, for reads too (a replica could show a lease that has moved on).
    Supported on PostgreSQL, SQLite and MySQL/MariaDB.

    :meth:`guard` holds the lease row locked for the caller's transaction, so a
    takeover waits until the guarded writes have committed (see there).
    """

    _model = StreamLease
    _vendors = QUOTES

    # -- helpers -----------------------------------------------------------------

    @staticmethod
    def _returning(connection: Any) -> bool:
        """Whether the acquire upsert can return the row (all but MySQL proper)."""
        if connection.vendor != "mysql":
            return True
        return connection.mysql_is_mariadb and connection.mysql_version >= (10, 5)

    @staticmethod
    def _run(connection: Any, sql: str, params: Sequence[Any], fetch: bool) -> Any:
        """Execute one statement; the fetched rows, or the row count."""
        if connection.queries_logged:  # DEBUG or CaptureQueriesContext: a logging cursor
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
                return cursor.fetchall() if fetch else cursor.rowcount
        cursor = kept_cursor(connection)
        try:
            cursor.execute(sql, params)
            # fetchall, not fetchone: SQLite keeps an unfinished statement's write
            # lock, and MySQL refuses the next command until the rows are read.
            return cursor.fetchall() if fetch else cursor.rowcount
        except BaseException:
            connection.__dict__.pop(KEPT_CURSOR, None)
            raise

    @staticmethod
    def _datetime(connection: Any, value: Any) -> datetime:
        """A datetime read by raw SQL, as the model field would return it."""
        convert = getattr(connection.ops, "convert_datetimefield_value", None)
        return value if convert is None else convert(value, None, connection)

    def _update(
        self, connection: Any, assignments: Assignments, values: list[Any], lease: Lease
    ) -> int:
        """Run a guarded ``UPDATE`` of *lease*; the number of rows it matched."""
        ops = connection.ops
        sql = _guarded_update_sql(connection.vendor, assignments)
        params = [
            *values,
            lease.name,
            lease.owner,
            lease.token,
            ops.adapt_datetimefield_value(timezone.now()),
        ]
        return self._run(connection, sql, params, fetch=False)

    # -- the SPI -----------------------------------------------------------------

    def try_acquire(self, name: str, owner: str, ttl: timedelta | float) -> Lease | None:
        check_owner(owner)
        delta = ttl_delta(ttl)
        connection = self._connection()
        now = timezone.now()
        expires_at = now + delta
        adapt = connection.ops.adapt_datetimefield_value
        params = [name, owner, adapt(now), adapt(expires_at)]
        try:
            if self._returning(connection):
                sql = _acquire_sql(connection.vendor, True)
                rows = self._run(connection, sql, params, fetch=True)
            else:
                rows = self._acquire_then_read(connection, params)
        except Error as error:
            warn_unavailable("acquire", name, error)
            return None
        if not rows:
            return None
        held_by, token, acquired_at, stored_expiry = rows[0]
        if held_by != owner or self._datetime(connection, stored_expiry) != expires_at:
            return None
        return Lease(name, owner, int(token), self._datetime(connection, acquired_at), expires_at)

    def _acquire_then_read(self, connection: Any, params: list[Any]) -> list[Any]:
        """MySQL without ``RETURNING``: the upsert, then a read of the row.

        Two statements because MySQL cannot return the row from an upsert. The
        write alone decides who holds the lease (it is atomic); the read, on the
        same connection right after it, only tells whether it took: the row shows
        our owner with our exact expiry only if our upsert set them. Should the
        row change in between (only possible once our new lease has expired, or
        through a concurrent call by the same owner), we report ``None``: at
        worst a lease we hold goes unused until it expires, never a lease we do
        not hold.
        """
        self._run(connection, _acquire_sql("mysql", False), params, fetch=False)
        q = QUOTES["mysql"]
        sql = (
            f"SELECT {q('owner')}, {q('token')}, {q('acquired_at')}, {q('expires_at')} "
            f"FROM {q(StreamLease._meta.db_table)} WHERE {q('name')} = %s"
        )
        return self._run(connection, sql, params[:1], fetch=True)

    def renew(self, lease: Lease, ttl: timedelta | float) -> Lease | None:
        delta = ttl_delta(ttl)
        connection = self._connection()
        expires_at = timezone.now() + delta
        try:
            updated = self._update(
                connection, _RENEW, [connection.ops.adapt_datetimefield_value(expires_at)], lease
            )
        except Error as error:
            warn_unavailable("renewal", lease.name, error)
            return None
        if updated != 1:
            return None
        return Lease(lease.name, lease.owner, lease.token, lease.acquired_at, expires_at)

    def release(self, lease: Lease) -> bool:
        return self._update(self._connection(), _RELEASE, [], lease) == 1

    def owner_of(self, name: str) -> Lease | None:
        row = (
            StreamLease.objects.using(self._alias())
            .filter(pk=name, expires_at__gt=timezone.now())
            .exclude(owner="")
            .first()
        )
        return None if row is None else _to_lease(row)

    @contextlib.contextmanager
    def guard(self, lease: Lease) -> Iterator[None]:
        """Run the block in a transaction that holds the lease row locked.

        Within ``transaction.atomic(using=<this service's database>)`` one
        ``SELECT … FOR UPDATE`` locks the row if it is still held (same owner and
        token, not expired); ``LeaseLostError`` is raised otherwise. Until the block's
        transaction ends, another host's ``try_acquire`` waits on that row lock, so
        a takeover cannot slip between the check and the block's writes to this
        database: they commit under the old token, and the next holder's token is
        bigger. Writes to other databases or systems get no such protection.

        SQLite ignores ``FOR UPDATE``; there the check is a no-op ``UPDATE`` of the
        row, which takes SQLite's single write lock for the whole transaction
        (other writers, ``try_acquire`` included, wait on the busy timeout).
        """
        alias = self._alias()
        connection = self._connection()
        # No savepoint: inside the caller's transaction (a transactional stream's
        # event) a lost lease must roll the whole transaction back anyway, and two
        # round trips per guarded write are saved.
        with transaction.atomic(using=alias, savepoint=False):
            if connection.vendor == "sqlite":
                held = self._update(connection, _TOUCH, [], lease) == 1
            else:
                # Raw SQL on the kept cursor: this runs before every fenced write,
                # and a queryset costs about a millisecond more per call.
                params = [
                    lease.name,
                    lease.owner,
                    lease.token,
                    connection.ops.adapt_datetimefield_value(timezone.now()),
                ]
                sql = _locking_read_sql(connection.vendor)
                held = bool(self._run(connection, sql, params, fetch=True))
            if not held:
                raise LeaseLostError(
                    f"the lease on {lease.name!r} (token {lease.token}) is no longer held by "
                    f"{lease.owner!r}"
                )
            yield

    # -- configuration checks ----------------------------------------------------

    @classmethod
    def check_options(cls, alias: str, options: Mapping[str, Any]) -> list[checks.CheckMessage]:
        def supports(connection: Any) -> bool:
            return connection.vendor in QUOTES

        setting = lock_services.alias_setting(alias)
        return check_using(setting, options, supports, "OrmLockService", "lock service")


def _to_lease(row: StreamLease) -> Lease:
    return Lease(row.name, row.owner, row.token, row.acquired_at, row.expires_at)
