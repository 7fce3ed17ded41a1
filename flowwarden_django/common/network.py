"""Bounds on how long a silent network partition goes unnoticed (issue 51).

A link that drops packets without a reset (a switch port down, a NAT table or a load
balancer that forgot the flow) leaves a client blocked in ``recv`` until the kernel
gives up retransmitting: about 15 minutes on Linux. The connections the package opens
or configures get timeouts and TCP keepalives derived from one setting,
``FLOWWARDEN["DEAD_CONNECTION_TIMEOUT"]`` (30 s by default), so a partition is noticed
within that bound:

* keepalives probe an idle connection after a third of it, then every sixth, four
  times (``idle + 4 * interval`` = the bound): they catch a connection that waits;
* ``tcp_user_timeout`` (PostgreSQL) and the socket timeout (Redis), 90 % of the
  bound, catch one whose request went unanswered (keepalives do not probe while data
  is unacknowledged);
* a connect timeout of a third of the bound (PostgreSQL and MongoDB; 90 % of it for
  Redis) ends a new connection's wait for a server it cannot reach;
* PostgreSQL's ``idle_in_transaction_session_timeout`` (the bound, set for the
  session through libpq's ``options``) ends, on the server, a transaction whose client
  went silent in the middle of it: without it the server keeps that session and its
  row locks (an anchor's row, a settled mark) until its own TCP gives up, minutes
  later, and the client's next transaction, on a new connection once the link is
  back, waits for those locks all that time;
* pymongo's clients (:func:`mongo_options`) get a heartbeat, a connect and a
  server-selection timeout of a third of the bound each and a socket timeout of 90 %
  of it (more than a change stream's ``getMore`` may wait), unless the URL or the
  options set them.
* gRPC (Temporal) sends an HTTP/2 ping after half the bound without a frame received,
  and closes the connection when the ping is not answered within the other half; the
  interval is never below 10 s, the least Temporal's server accepts.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from ..conf import fw_settings
from .durations import parse_duration

#: Keepalive probes sent before a connection is declared dead.
KEEPALIVE_PROBES = 4
#: The share of the bound a request may wait for its answer: the kernel notices a
#: ``tcp_user_timeout`` at its next retransmission after it, and a worker may send
#: its request a moment after the partition began (measured: 0.7 s over at 30 s).
REQUEST_SHARE = 0.9


@dataclass(frozen=True)
class KeepaliveTimings:
    """TCP keepalive timings (whole seconds) that notice a dead peer within a bound."""

    idle: int
    interval: int
    probes: int

    @classmethod
    def within(cls, bound: float) -> KeepaliveTimings:
        """Timings whose ``idle + probes * interval`` is at most *bound* (from 3 s; the
        idle time and the interval are at least 1 s, and there is at least one probe)."""
        idle = max(1, int(bound // 3))
        interval = max(1, int(bound // 6))
        probes = max(1, min(KEEPALIVE_PROBES, int((bound - idle) // interval)))
        return cls(idle=idle, interval=interval, probes=probes)


def dead_connection_timeout() -> float:
    """``FLOWWARDEN["DEAD_CONNECTION_TIMEOUT"]`` in seconds."""
    return parse_duration(fw_settings.DEAD_CONNECTION_TIMEOUT)


#: The PostgreSQL setting that ends a session left idle inside a transaction (in
#: milliseconds): :func:`postgres_options` sets it to the bound through ``options``.
SERVER_IDLE_SETTING = "idle_in_transaction_session_timeout"


def postgres_options(bound: float | None = None) -> dict[str, int | str]:
    """The libpq parameters (a ``DATABASES`` entry's ``OPTIONS``) that notice a silent
    partition within *bound* seconds (``DEAD_CONNECTION_TIMEOUT`` by default), on the
    client and, for a transaction it left open, on the server."""
    bound = dead_connection_timeout() if bound is None else bound
    timings = KeepaliveTimings.within(bound)
    return {
        "connect_timeout": max(2, int(bound // 3)),
        "keepalives": 1,
        "keepalives_idle": timings.idle,
        "keepalives_interval": timings.interval,
        "keepalives_count": timings.probes,
        "tcp_user_timeout": int(bound * REQUEST_SHARE * 1000),
        "options": f"-c {SERVER_IDLE_SETTING}={int(bound * 1000)}",
    }


def redis_options(bound: float | None = None) -> dict[str, Any]:
    """redis-py client keyword arguments that notice a silent partition within *bound*
    seconds (``DEAD_CONNECTION_TIMEOUT`` by default): no command waits longer for its
    answer, a connection idle that long is checked with a PING before use, and an idle
    connection is probed by keepalives."""
    bound = dead_connection_timeout() if bound is None else bound
    timings = KeepaliveTimings.within(bound)
    request_timeout = round(bound * REQUEST_SHARE, 3)
    keepalive_options = {}
    for name, value in (
        ("TCP_KEEPIDLE", timings.idle),
        ("TCP_KEEPINTVL", timings.interval),
        ("TCP_KEEPCNT", timings.probes),
    ):
        option = getattr(socket, name, None)  # Linux names; macOS lacks TCP_KEEPIDLE
        if option is not None:
            keepalive_options[option] = value
    return {
        "socket_timeout": request_timeout,
        "socket_connect_timeout": request_timeout,
        "health_check_interval": bound,
        "socket_keepalive": True,
        "socket_keepalive_options": keepalive_options,
    }


#: The shortest ping interval Temporal's frontend accepts (its ``keepAliveMinTime``):
#: a client pinging more often is sent ``GOAWAY`` ("too many pings").
GRPC_MIN_PING_INTERVAL = 10.0
#: The shortest wait for a ping's answer.
GRPC_MIN_PING_TIMEOUT = 1.0


@dataclass(frozen=True)
class GrpcKeepalive:
    """HTTP/2 keepalive timings (milliseconds) of a gRPC client connection: a ping after
    ``interval_ms`` without a frame received, the connection closed when it is not
    answered within ``timeout_ms``."""

    interval_ms: int
    timeout_ms: int

    @classmethod
    def within(cls, bound: float) -> GrpcKeepalive:
        """Timings that notice a dead peer within *bound* seconds (``interval + timeout``),
        the interval at least :data:`GRPC_MIN_PING_INTERVAL` (so a bound under 20 s
        is noticed after that interval and half the bound)."""
        interval = max(bound / 2, GRPC_MIN_PING_INTERVAL)
        timeout = max(min(bound - interval, bound / 2), GRPC_MIN_PING_TIMEOUT)
        return cls(interval_ms=int(interval * 1000), timeout_ms=int(timeout * 1000))


def grpc_keepalive(bound: float | None = None) -> GrpcKeepalive:
    """The gRPC keepalive timings for *bound* seconds (``DEAD_CONNECTION_TIMEOUT`` by
    default)."""
    return GrpcKeepalive.within(dead_connection_timeout() if bound is None else bound)


#: What a change stream's ``getMore`` may take beyond its ``maxAwaitTimeMS`` before the
#: socket timeout ends it (the round trip and a busy server).
MONGO_AWAIT_ROOM_MS = 1000
#: pymongo's longest heartbeat by default (``heartbeatFrequencyMS``).
MONGO_HEARTBEAT_MS = 10_000


def mongo_options(bound: float | None = None, max_await_ms: int = 0) -> dict[str, int]:
    """pymongo client options that notice a silent partition within *bound* seconds
    (``DEAD_CONNECTION_TIMEOUT`` by default).

    The monitor checks the server every third of the bound (at most pymongo's 10 s)
    and gives up on a check after a third (``connectTimeoutMS``, which is also a new
    connection's): within two thirds, a silent server is marked unknown and the
    requests waiting on it are interrupted. An operation then waits a third more for
    a server to send it to (``serverSelectionTimeoutMS``), and fails: the bound.
    No request waits longer than 90 % of it for its answer (``socketTimeoutMS``; a
    change stream's ``getMore``, which the server holds for *max_await_ms*, gets
    that and :data:`MONGO_AWAIT_ROOM_MS` more). pymongo's own keepalives (2 minutes
    idle) do not fit a short bound."""
    bound = dead_connection_timeout() if bound is None else bound
    third_ms = max(500, int(bound * 1000 / 3))
    return {
        "socketTimeoutMS": max(
            int(bound * REQUEST_SHARE * 1000), max_await_ms + MONGO_AWAIT_ROOM_MS
        ),
        "connectTimeoutMS": third_ms,
        "serverSelectionTimeoutMS": third_ms,
        "heartbeatFrequencyMS": min(MONGO_HEARTBEAT_MS, third_ms),
    }


def with_mongo_timeouts(
    url: str, options: Mapping[str, Any], *, bound: float | None = None, max_await_ms: int = 0
) -> dict[str, Any]:
    """*options* (``MongoClient`` keyword arguments) with each of :func:`mongo_options`
    that neither they nor *url*'s query set (pymongo's names are case-insensitive).
    A client-side operation timeout (``timeoutMS``) owns the socket timeout: then none
    is added."""
    given = {name.lower() for name in options}
    given |= {name.lower() for name, _value in parse_qsl(urlsplit(url).query)}
    derived = mongo_options(bound, max_await_ms)
    if "timeoutms" in given:
        derived.pop("socketTimeoutMS")
    return {
        **{name: value for name, value in derived.items() if name.lower() not in given},
        **options,
    }
