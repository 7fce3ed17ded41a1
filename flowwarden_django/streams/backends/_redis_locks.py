"""Lock service on Redis: one hash per lease, the reference's fields plus a token.

Keys (prefix ``fw:`` by default), each kind in a namespace of its own, so no
lease name can reach another lease's keys or another kind of key:

* ``{key_prefix}lease:{name}``: a hash of ``owner``, ``token``, ``acquiredAt``
  and ``expiresAt`` (epoch milliseconds), with ``PEXPIREAT`` at ``expiresAt`` so
  Redis drops lapsed leases itself.
* ``{key_prefix}fence:{name}``: the fencing counter, never expiring, ``INCR``-ed
  whenever a new tenure starts, so tokens do not restart after a release or an
  expiry.

Acquire, renew and release are Lua scripts, each atomic on the server.

Earlier versions kept the lease hash at ``{key_prefix}lock:{name}`` and its counter at
``{key_prefix}lock:{name}:fence``, so the lease named ``orders:fence`` was the
counter of ``orders`` (``WRONGTYPE``, for good: the counter never expires). The
first tenure of a name under the new layout starts above that old counter
(:data:`ACQUIRE` reads it once, when the new counter does not exist yet), so
tokens keep growing across the upgrade. Old lease hashes are not read: stop
every process of the old version before starting the new one (a lease lasts one
TTL). The old ``lock:*`` keys are then unused and may be deleted.

Expiry is judged against the caller's clock (``ARGV`` "now"), as in the other
backends; Redis's own clock only decides when the key disappears. On Redis
Cluster the keys of a lease must share a slot: put a hash tag in the prefix
(``key_prefix="fw:{locks}:"``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core import checks
from django.utils import timezone

from ..locks import Lease, ttl_delta
from ..stores import lock_services
from ._calls import Operation, call
from ._lock_common import check_owner, warn_unavailable
from ._native_locks import NativeLockService
from ._redis_common import PrefixedRedisConnection, Script, redis_option_checks

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)

# KEYS: lease hash, fence counter, the counter's pre-namespace key (read once).
# ARGV: owner, now (ms), expiresAt (ms).
# Returns {token, acquiredAt} or nil when another owner holds an unexpired lease.
ACQUIRE = """
local cur = redis.call('HMGET', KEYS[1], 'owner', 'token', 'acquiredAt', 'expiresAt')
local valid = cur[1] and cur[4] and tonumber(cur[4]) > tonumber(ARGV[2])
if valid and cur[1] ~= ARGV[1] then return nil end
local token, acquired
if valid then
  token, acquired = cur[2], cur[3]
else
  if redis.call('EXISTS', KEYS[2]) == 0
     and redis.call('TYPE', KEYS[3])['ok'] == 'string' then
    local old = tonumber(redis.call('GET', KEYS[3]))
    if old then redis.call('SET', KEYS[2], string.format('%d', old)) end
  end
  token, acquired = tostring(redis.call('INCR', KEYS[2])), ARGV[2]
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', token, 'acquiredAt', acquired,
           'expiresAt', ARGV[3])
redis.call('PEXPIREAT', KEYS[1], ARGV[3])
return {token, acquired}
"""

# KEYS: lease hash. ARGV: owner, token, now (ms), then the new expiresAt (ms) for a
# renewal or nothing for a release. Returns 1 when the lease was still held.
RENEW_OR_RELEASE = """
local cur = redis.call('HMGET', KEYS[1], 'owner', 'token', 'expiresAt')
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] or not cur[3]
   or tonumber(cur[3]) <= tonumber(ARGV[3]) then
  return 0
end
if ARGV[4] then
  redis.call('HSET', KEYS[1], 'expiresAt', ARGV[4])
  redis.call('PEXPIREAT', KEYS[1], ARGV[4])
else
  redis.call('DEL', KEYS[1])
end
return 1
"""


def _ms(value: datetime) -> int:
    return (value - _EPOCH) // _MS


def _time(ms: int | bytes) -> datetime:
    return _EPOCH + int(ms) * _MS


def _now_ms() -> int:
    return _ms(timezone.now())


#: The fields ``owner_of`` reads, in the order :func:`_held` takes them.
_LEASE_FIELDS = ("owner", "token", "acquiredAt", "expiresAt")


def _renewal_times(ttl: timedelta | float) -> tuple[int, int]:
    """Now and the renewed expiresAt, both in epoch milliseconds."""
    delta = ttl_delta(ttl)
    now = _now_ms()
    return now, now + delta // _MS


def _acquired(name: str, owner: str, result: Any, expires: int) -> Lease | None:
    """The lease :data:`ACQUIRE` returned ``{token, acquiredAt}`` for, or ``None``."""
    if result is None:
        return None
    token, acquired = result
    return Lease(name, owner, int(token), _time(acquired), _time(expires))


def _renewed(lease: Lease, renewed: bool, expires: int) -> Lease | None:
    """*lease* extended to *expires* when the renewal took, else ``None``."""
    if not renewed:
        return None
    return Lease(lease.name, lease.owner, lease.token, lease.acquired_at, _time(expires))


def _held(name: str, values: list[Any]) -> Lease | None:
    """The unexpired lease in the hash fields :data:`_LEASE_FIELDS`, or ``None``."""
    owner, token, acquired, expires = values
    if not owner or expires is None or int(expires) <= _now_ms():
        return None
    return Lease(name, owner.decode(), int(token), _time(acquired), _time(expires))


def _same_tenure(lease: Lease, current: Lease | None) -> bool:
    """Whether *current* (the unexpired lease, if any) is *lease*'s tenure."""
    return current is not None and current.owner == lease.owner and current.token == lease.token


class RedisLockService(PrefixedRedisConnection, NativeLockService):
    """Leases in Redis hashes, with a fencing counter per name.

    Connect as ``RedisCheckpointStore`` does: a django-redis cache alias
    (``cache="default"``, the default), a ``url`` such as
    ``redis://127.0.0.1:6379/0``, or a ready redis-py ``client``.
    Times are kept in whole milliseconds.
    """

    def key(self, name: str) -> str:
        """The hash key of one lease."""
        return f"{self.key_prefix}lease:{name}"

    def fence_key(self, name: str) -> str:
        """The key of one lease's fencing counter."""
        return f"{self.key_prefix}fence:{name}"

    def legacy_fence_key(self, name: str) -> str:
        """Where the fencing counter was before each kind of key had its namespace."""
        return f"{self.key_prefix}lock:{name}:fence"

    # -- what the sync and async paths share ----------------------------------------

    def _acquire_call(
        self, name: str, owner: str, ttl: timedelta | float
    ) -> tuple[list[str], list[Any], int]:
        """The keys and arguments of :data:`ACQUIRE`, and the new expiresAt (ms)."""
        check_owner(owner)
        delta = ttl_delta(ttl)
        now = _now_ms()
        expires = now + delta // _MS
        keys = [self.key(name), self.fence_key(name), self.legacy_fence_key(name)]
        return keys, [owner, now, expires], expires

    def _renew_or_release_call(
        self, lease: Lease, now: int, expires: int | None
    ) -> tuple[list[str], list[Any]]:
        """The keys and arguments of :data:`RENEW_OR_RELEASE`."""
        args: list[Any] = [lease.owner, str(lease.token), now]
        if expires is not None:
            args.append(expires)
        return [self.key(lease.name)], args

    # -- the store operations, each run by the sync and the async API --------------

    def _try_acquire_operation(
        self, name: str, owner: str, ttl: timedelta | float
    ) -> Operation[Lease | None]:
        from redis.exceptions import RedisError

        keys, args, expires = self._acquire_call(name, owner, ttl)
        try:
            result = yield Script(ACQUIRE, keys, args)
        except RedisError as error:
            warn_unavailable("acquire", name, error)
            return None
        return _acquired(name, owner, result, expires)

    def _renew_operation(self, lease: Lease, ttl: timedelta | float) -> Operation[Lease | None]:
        from redis.exceptions import RedisError

        now, expires = _renewal_times(ttl)
        try:
            renewed = yield from self._renew_or_release(lease, now, expires)
        except RedisError as error:
            warn_unavailable("renewal", lease.name, error)
            return None
        return _renewed(lease, renewed, expires)

    def _release_operation(self, lease: Lease) -> Operation[bool]:
        return (yield from self._renew_or_release(lease, _now_ms(), None))

    def _renew_or_release(self, lease: Lease, now: int, expires: int | None) -> Operation[bool]:
        keys, args = self._renew_or_release_call(lease, now, expires)
        return (yield Script(RENEW_OR_RELEASE, keys, args)) == 1

    def _owner_of_operation(self, name: str) -> Operation[Lease | None]:
        return _held(name, (yield call("hmget", self.key(name), *_LEASE_FIELDS)))

    def _is_current_operation(self, lease: Lease) -> Operation[bool]:
        return _same_tenure(lease, (yield from self._owner_of_operation(lease.name)))

    # -- configuration checks ----------------------------------------------------

    @classmethod
    def check_options(cls, alias: str, options: Mapping[str, Any]) -> list[checks.CheckMessage]:
        """The same checks as ``RedisCheckpointStore``, named for ``LOCK_SERVICES``."""
        return redis_option_checks(lock_services.alias_setting(alias), cls.__name__, options)
