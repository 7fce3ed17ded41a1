"""The workflow queues as configured: ``FLOWWARDEN["WORKFLOW_QUEUES"]``, a mapping of
queue names to their limits::

    "WORKFLOW_QUEUES": {
        "carrier-api": {"concurrency": 5, "worker_concurrency": 2, "rate": "100/m",
                        "priority": True},
        "per-customer": {"concurrency": 1, "partitioned": True},
    }

* ``concurrency``: steps of the queue's runs that execute at the same moment, across
  every process and provider;
* ``worker_concurrency``: the same, per process;
* ``rate``: step starts per period, ``"N/s"``, ``"N/m"``, ``"N/h"``, ``"N/d"`` or
  ``"N/<duration>"`` (``"10/30s"``): no window of that length holds more than N;
* ``priority``: whether ``start(priority=...)`` orders the waiting steps (lower first);
* ``partitioned``: the limits hold per ``start(partition_key=...)``, not for the queue;
* ``scope``: ``"steps"`` (the default: a slot is held while one step runs) or
  ``"runs"`` (held from a run's first step until it pauses or ends, DBOS's meaning).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ...common.durations import parse_duration
from ...conf import SETTING_NAME, fw_settings

SETTING = f'{SETTING_NAME}["WORKFLOW_QUEUES"]'
#: The keys a queue's options may have.
QUEUE_KEYS = ("concurrency", "worker_concurrency", "rate", "priority", "partitioned", "scope")
SCOPES = ("steps", "runs")
#: The longest queue name (``WorkflowRun.queue``).
MAX_NAME = 100
_PERIODS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hour": 3600.0}
_PERIODS.update({"d": 86400.0, "day": 86400.0, "second": 1.0, "minute": 60.0})
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\S+)\s*$")
#: The most slots a limit may have (each is a row).
MAX_LIMIT = 10_000


class UnknownQueueError(LookupError):
    """A run or a workflow names a queue ``FLOWWARDEN["WORKFLOW_QUEUES"]`` lacks."""


@dataclasses.dataclass(frozen=True)
class Rate:
    """At most *limit* step starts in any window of *period* seconds."""

    limit: int
    period: float
    text: str

    def __str__(self) -> str:
        return self.text


@dataclasses.dataclass(frozen=True)
class QueueConfig:
    """One queue's limits (see the module); ``None`` means no such limit."""

    name: str
    concurrency: int | None = None
    worker_concurrency: int | None = None
    rate: Rate | None = None
    priority: bool = False
    partitioned: bool = False
    scope: str = "steps"

    def partition_of(self, key: str | None) -> str:
        """The partition a run with *key* counts in ("" unless partitioned)."""
        return (key or "") if self.partitioned else ""

    @property
    def holds_runs(self) -> bool:
        """Whether a slot is held for a run's whole stay in ``running``."""
        return self.scope == "runs"


def parse_rate(value: Any) -> Rate:
    """``"100/m"`` as a ``Rate``; ``ValueError`` saying the form otherwise."""
    match = _RATE.match(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(
            f"invalid rate {value!r}: use 'N/s', 'N/m', 'N/h', 'N/d' or 'N/<duration>'"
        )
    limit, unit = int(match.group(1)), match.group(2)
    if unit in _PERIODS:
        period = _PERIODS[unit]
    else:
        try:
            period = parse_duration(unit)
        except ValueError:
            raise ValueError(
                f"invalid rate {value!r}: the period {unit!r} is not s, m, h, d or a duration"
            ) from None
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"invalid rate {value!r}: the count must be 1 to {MAX_LIMIT}")
    if period <= 0:
        raise ValueError(f"invalid rate {value!r}: the period must be positive")
    return Rate(limit, period, value.strip())


def _limit(name: str, key: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
        raise ValueError(
            f"queue {name!r}: {key} must be a whole number from 1 to {MAX_LIMIT}, not {value!r}"
        )
    return value


def build_queue(name: Any, options: Any) -> QueueConfig:
    """One queue's ``QueueConfig``; ``ValueError`` naming what is wrong."""
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME:
        raise ValueError(
            f"queue name {name!r} must be a non-blank string of at most {MAX_NAME} characters"
        )
    if not isinstance(options, dict):
        raise ValueError(
            f"queue {name!r}: its options must be a dict, not {type(options).__name__}"
        )
    unknown = sorted(set(options) - set(QUEUE_KEYS))
    if unknown:
        raise ValueError(f"queue {name!r}: unknown option(s) {', '.join(map(repr, unknown))}")
    for flag in ("priority", "partitioned"):
        if not isinstance(options.get(flag, False), bool):
            raise ValueError(f"queue {name!r}: {flag} must be True or False")
    scope = options.get("scope", "steps")
    if scope not in SCOPES:
        raise ValueError(f"queue {name!r}: scope must be 'steps' or 'runs', not {scope!r}")
    rate = options.get("rate")
    try:
        parsed_rate = None if rate is None else parse_rate(rate)
    except ValueError as exc:
        raise ValueError(f"queue {name!r}: {exc}") from None
    config = QueueConfig(
        name=name,
        concurrency=_limit(name, "concurrency", options.get("concurrency")),
        worker_concurrency=_limit(name, "worker_concurrency", options.get("worker_concurrency")),
        rate=parsed_rate,
        priority=options.get("priority", False),
        partitioned=options.get("partitioned", False),
        scope=scope,
    )
    if config.concurrency is None and config.worker_concurrency is None and config.rate is None:
        raise ValueError(
            f"queue {name!r} sets no limit: give concurrency, worker_concurrency or rate"
        )
    if scope == "runs" and config.concurrency is None:
        raise ValueError(
            f"queue {name!r}: scope 'runs' bounds runs in flight; it needs concurrency"
        )
    return config


_cache: tuple[int, Any, dict[str, QueueConfig]] | None = None


def queue_configs() -> dict[str, QueueConfig]:
    """Every configured queue by name (``ValueError`` for a bad setting, which
    ``manage.py check`` reports first)."""
    global _cache
    value = fw_settings.WORKFLOW_QUEUES
    cached = _cache
    if cached is not None and cached[0] == id(value) and cached[1] is value:
        return cached[2]
    if not isinstance(value, dict):
        raise ValueError(f"{SETTING} must be a dict of queue names to options")
    configs = {name: build_queue(name, options) for name, options in value.items()}
    _cache = (id(value), value, configs)
    return configs


def queue_config(name: str) -> QueueConfig:
    """Queue *name*'s ``QueueConfig``; ``UnknownQueueError`` with the known ones."""
    configs = queue_configs()
    try:
        return configs[name]
    except KeyError:
        known = ", ".join(sorted(configs)) or "none is configured"
        raise UnknownQueueError(f"no workflow queue {name!r} in {SETTING} ({known})") from None
