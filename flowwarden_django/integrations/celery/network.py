"""Bounds on silent network partitions for a Celery app's connections (issue 51).

A worker or a publisher whose link to the broker or the result backend drops without
a reset waits, by Celery's defaults, for an AMQP heartbeat of 120 s to be missed twice,
or (Redis) for the kernel's retransmission timeout, about 15 minutes. The settings
:func:`network_settings` gives notice such a partition within
``FLOWWARDEN["DEAD_CONNECTION_TIMEOUT"]`` (30 s, ``common/network.py``):

* AMQP broker: ``broker_heartbeat`` a third of the bound (py-amqp drops a connection
  that missed two heartbeats);
* Redis broker: ``broker_transport_options`` with socket and connect timeouts, TCP
  keepalives and kombu's health checks of its BRPOP and pub/sub connections every sixth
  of the bound (kombu drops a BRPOP connection whose answer is overdue by that much
  past ``brpop_timeout``, 1 s, at its next check: within a third of the bound);
* Redis result backend: ``redis_socket_timeout``, ``redis_socket_connect_timeout``,
  ``redis_socket_keepalive`` and ``redis_backend_health_check_interval``.

Every ``celery worker`` that imports this package gets them at start
(``bootstep.install_from_settings``) for each one its configuration leaves at Celery's
default; the processes that only publish (the web, a stream's reader) get them from
:func:`configure_network`, called where the project builds its Celery app, and
``check --deploy`` (W510) says what is missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from ...common.network import KeepaliveTimings, dead_connection_timeout, redis_options

#: URL schemes of kombu's and Celery's Redis transports and result backends.
REDIS_SCHEMES = frozenset({"redis", "rediss", "sentinel", "redis+socket", "socket"})
#: URL schemes of kombu's AMQP transports (a missing URL is kombu's default, AMQP).
AMQP_SCHEMES = frozenset({"amqp", "amqps", "pyamqp", "librabbitmq", ""})
#: The transport options that bound a Redis broker connection's silence.
REDIS_TRANSPORT_KEYS = (
    "socket_timeout",
    "socket_connect_timeout",
    "socket_keepalive",
    "socket_keepalive_options",
    "health_check_interval",
)


def scheme_of(url: Any) -> str:
    """The scheme of a broker or backend URL (the first of a list or a ``;`` list);
    ``""`` when none is given."""
    if isinstance(url, (list, tuple)):
        url = url[0] if url else ""
    text = str(url or "").split(";", 1)[0].strip()
    if "://" not in text:
        return text.lower() if text else ""
    return urlsplit(text).scheme.lower()


def check_interval(bound: float, share: int = 3) -> int:
    """A health-check interval within *bound*: a *share*-th of it, at least 1 s."""
    return max(1, int(bound // share))


def network_settings(conf: Any, bound: float | None = None) -> dict[str, Any]:
    """The Celery settings (lowercase names) that notice a silent partition of the
    broker or the result backend of an app configured by *conf* (``app.conf``) within
    *bound* seconds (``DEAD_CONNECTION_TIMEOUT`` by default). ``broker_transport_options``
    holds only the keys this bound needs."""
    bound = dead_connection_timeout() if bound is None else bound
    wanted: dict[str, Any] = {}
    broker = scheme_of(setting_of(conf, "broker_url"))
    if broker in REDIS_SCHEMES:
        options = redis_options(bound)
        # kombu drops a BRPOP connection at the first check after brpop_timeout (1 s)
        # plus this: a sixth makes 1 + 2 * bound / 6, within the bound from 3 s.
        options["health_check_interval"] = check_interval(bound, 6)
        wanted["broker_transport_options"] = {key: options[key] for key in REDIS_TRANSPORT_KEYS}
    elif broker in AMQP_SCHEMES:
        wanted["broker_heartbeat"] = KeepaliveTimings.within(bound).idle
    if scheme_of(setting_of(conf, "result_backend")) in REDIS_SCHEMES:
        options = redis_options(bound)
        wanted["redis_socket_timeout"] = options["socket_timeout"]
        wanted["redis_socket_connect_timeout"] = options["socket_connect_timeout"]
        wanted["redis_socket_keepalive"] = True
        wanted["redis_backend_health_check_interval"] = check_interval(bound)
    return wanted


def setting_of(conf: Any, key: str) -> Any:
    """*conf*'s value of *key* (``app.conf`` or, in tests, a dict)."""
    # Celery's settings resolve the broker and backend URLs (the environment, old
    # names) as attributes; a plain mapping (tests) has the key or not.
    if isinstance(conf, dict):
        return conf.get(key)
    return getattr(conf, key, None)


def missing_settings(conf: Any, bound: float | None = None) -> dict[str, Any]:
    """What :func:`network_settings` gives that *conf* leaves unset: a setting still at
    Celery's default, or a transport option absent (the user's values are kept)."""
    from celery.app.defaults import DEFAULTS

    missing: dict[str, Any] = {}
    for key, value in network_settings(conf, bound).items():
        current = conf.get(key)
        if key == "broker_transport_options":
            given = current if isinstance(current, Mapping) else {}
            absent = {name: option for name, option in value.items() if name not in given}
            if absent:
                missing[key] = absent
        elif current is None or current == DEFAULTS.get(key):
            missing[key] = value
    return missing


def configure_network(app: Any, bound: float | None = None) -> dict[str, Any]:
    """Give *app* the settings of :func:`network_settings` it leaves unset (before it
    opens a connection: call it where the app is built, after ``config_from_object``);
    what was set. The user's own values are kept."""
    missing = missing_settings(app.conf, bound)
    for key, value in missing.items():
        if key == "broker_transport_options":
            # A new dict: the current one may be the project's settings object's.
            value = {**value, **dict(app.conf.get(key) or {})}
        app.conf[key] = value
    return missing


def literal(settings: Mapping[str, Any]) -> str:
    """*settings* as the lines of a Django settings module (``CELERY_`` namespace)."""
    return "; ".join(f"CELERY_{key.upper()} = {value!r}" for key, value in settings.items())
