"""What every declared stream is doing, across processes.

Each process running streams publishes one ``StreamWorker`` row per stream it runs
(or stands by for) every ``FLOWWARDEN["STATUS_INTERVAL"]``; operators' requests sit
in ``StreamControl``. :func:`stream_status` joins those rows with the declared
streams, their checkpoints and their dead-letter backlogs, so the health view,
``manage.py flowwarden_streams status``, the Prometheus exporter and the admin
console all tell the same story, whichever process asks.

A worker row not refreshed for three ``STATUS_INTERVAL``s belongs to a process that
is gone: it is *stale* and no longer counts.

Reports come in two views. With details (``manage.py flowwarden_streams status``,
staff on ``/flowwarden/health/``): instance ids (``<hostname>:<pid>``) and error
texts, which may quote event data, hosts or connection strings. Without
(anonymous callers): status and counts only; each instance id is replaced by
its :func:`instance_key`, an opaque name that is also the Prometheus ``instance``
label, and each error text by a summary naming what failed and the exception's
class.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError
from django.utils import timezone
from django.utils.crypto import salted_hmac

from ...conf import fw_settings
from ...models import StreamControl, StreamWorker
from ..initial_sync.progress import CopyProgress, copy_progress
from ..registry import StreamRegistry, stream_registry
from ..spec import StreamSpec, parse_duration
from ..stores import checkpoint_stores, dlq_stores

logger = logging.getLogger("flowwarden_django.streams.operations.status")

#: Stream states, from :func:`stream_state`.
RUNNING = "running"
COPYING = "copying"
RESTARTING = "restarting"
STARTING = "starting"
PAUSED = "paused"
CRASHED = "crashed"
STANDBY = "standby"
STOPPED = "stopped"

LEADER = "LEADER"

#: States in which the stream does its job (an initial sync is part of it).
WORKING = (RUNNING, COPYING)

#: A worker row older than this many status intervals is stale.
STALE_AFTER_INTERVALS = 3

#: Fields of a worker's report shown only with details.
WORKER_DETAIL_FIELDS = ("instance_id", "last_error", "parked_keys")


def instance_key(instance_id: str) -> str:
    """An opaque, stable name for *instance_id* (a keyed hash: it reveals no host).

    Keyed with ``SECRET_KEY``, so it cannot be reversed by hashing likely host
    names. The detailed health report lists it next to each instance id.
    """
    key = salted_hmac("flowwarden_django.instance_key", instance_id, algorithm="sha256")
    return key.hexdigest()[:12]


@dataclasses.dataclass(frozen=True)
class WorkerStatus:
    """One process's report about one stream (a fresh ``StreamWorker`` row)."""

    instance_id: str
    state: str
    role: str
    started_at: datetime | None
    last_event_at: datetime | None
    updated_at: datetime
    events: int = 0
    errors: int = 0
    retries: int = 0
    dead_lettered: int = 0
    restarts: int = 0
    last_error: str = ""
    #: The last error's class and where it arose (no message: safe to show anyone).
    error_kind: str = ""
    #: When this instance started restarting the stream (``None`` unless restarting).
    restarting_since: datetime | None = None
    #: A stream handled in parallel (``parallelism`` > 1): events in flight, events
    #: settled behind an unsettled one, and keys parked behind a failing event.
    in_flight: int = 0
    watermark_lag: int = 0
    parked_keys: tuple[str, ...] = ()

    @classmethod
    def from_row(cls, row: Any) -> WorkerStatus:
        """Copy a ``StreamWorker`` row."""
        values = {field.name: getattr(row, field.name) for field in dataclasses.fields(cls)}
        values["parked_keys"] = tuple(values["parked_keys"] or ())
        return cls(**values)

    @property
    def key(self) -> str:
        """This instance's :func:`instance_key`."""
        return instance_key(self.instance_id)

    def to_json(self, *, details: bool = True) -> dict[str, Any]:
        """JSON-compatible values (timestamps as ISO 8601 strings), plus ``key``.

        Without *details*, no ``instance_id`` and no ``last_error``.
        """
        values = {
            field.name: _json_value(getattr(self, field.name))
            for field in dataclasses.fields(self)
            if details or field.name not in WORKER_DETAIL_FIELDS
        }
        return {"key": self.key, **values}


@dataclasses.dataclass(frozen=True)
class StreamStatus:
    """One declared stream as every process sees it.

    ``state`` is one of ``running``, ``copying`` (an initial sync), ``restarting``,
    ``starting``, ``paused``, ``crashed``, ``standby`` and ``stopped`` (see
    :func:`stream_state`). ``initial_sync`` is the progress of the stream's last (or
    current) initial sync, ``None`` if it never copied.
    ``checkpoint_at`` is the processed anchor's time, else the seen anchor's;
    ``checkpoint_age_seconds`` and ``heartbeat_age_seconds`` are measured from
    ``now``. ``dlq_backlog`` is ``None`` when the stream has no dead-letter queue or
    its store cannot count. ``error`` says which read failed (checkpoint or DLQ
    store) and why; ``error_summary`` says the same without the exceptions'
    messages (which may name hosts). The other fields are still filled in.
    """

    name: str
    state: str
    deployment_mode: str
    enabled: bool
    auto_start: bool
    paused: bool
    healthy: bool
    leader: str | None = None
    instances: tuple[WorkerStatus, ...] = ()
    stale_instances: tuple[str, ...] = ()
    last_event_time: datetime | None = None
    checkpoint_at: datetime | None = None
    checkpoint_age_seconds: float | None = None
    heartbeat_at: datetime | None = None
    heartbeat_age_seconds: float | None = None
    dlq_backlog: int | None = None
    dlq_store: str | None = None
    restart_requested_at: datetime | None = None
    initial_sync: CopyProgress | None = None
    error: str | None = None
    error_summary: str | None = None
    #: The stream's ``parallelism`` (events handled at once).
    parallelism: int = 1
    #: ``False`` once :meth:`redacted`: parked keys are counted, not named.
    details: bool = True
    #: Whether the stream's events go through a window (``StreamSpec.windowed``).
    windowed: bool = False

    def redacted(self) -> StreamStatus:
        """This status as a caller without details may see it (the console under
        ``FLOWWARDEN["HEALTH_DETAILS"]``): instance keys instead of instance ids (host
        names), no ``last_error`` (it may hold event data), ``error_summary`` for
        ``error``, as :meth:`to_json` without details."""
        return dataclasses.replace(
            self,
            leader=None if self.leader is None else instance_key(self.leader),
            instances=tuple(
                dataclasses.replace(
                    i,
                    instance_id=i.key,
                    last_error="",
                    parked_keys=("",) * len(i.parked_keys),  # counted, not named
                )
                for i in self.instances
            ),
            details=False,
            stale_instances=tuple(instance_key(i) for i in self.stale_instances),
            error=self.error_summary,
        )

    @property
    def live_instances(self) -> tuple[WorkerStatus, ...]:
        """The instances that run the stream, copy it, bring it up or stand by for it:
        not those that report it stopped, paused or crashed."""
        return tuple(i for i in self.instances if i.state not in (STOPPED, PAUSED, CRASHED))

    @property
    def required(self) -> bool:
        """Whether health needs this stream running (enabled and auto-start)."""
        return self.enabled and self.auto_start

    @property
    def in_flight(self) -> int:
        """Events in flight in every live instance (a stream handled in parallel)."""
        return sum(i.in_flight for i in self.live_instances)

    @property
    def watermark_lag(self) -> int:
        """Events settled beyond the processed anchor, behind an unsettled one."""
        return sum(i.watermark_lag for i in self.live_instances)

    @property
    def parked_keys(self) -> tuple[str, ...]:
        """Keys parked behind a failing event, in every live instance."""
        return tuple(key for i in self.live_instances for key in i.parked_keys)

    def window_note(self) -> str:
        """What a stream handled in parallel has in its window (for example ``"12 in
        flight, 40 settled beyond the anchor, 1 key parked"``), or ``""``."""
        parallelism = self.parallelism
        if not self.windowed or not self.live_instances:
            return ""
        parked = self.parked_keys
        note = (
            f"{self.in_flight} in flight (parallelism {parallelism}), "
            f"{self.watermark_lag} settled beyond the anchor"
        )
        if parked:
            count = len(parked)
            note += f", {count} key{'s' if count > 1 else ''} parked"
            if self.details:
                note += f" ({', '.join(parked[:5])}{', ...' if count > 5 else ''})"
        return note

    def restart_note(self) -> str:
        """Why and since when the stream is restarting, from its instances (for
        example ``"restarting since 10:23:01 UTC: OperationalError in
        OrmCheckpointStore.save_processed"``), or ``""``."""
        restarting = [i for i in self.instances if i.state == RESTARTING]
        if not restarting:
            return ""
        first = min(restarting, key=lambda i: i.restarting_since or i.updated_at)
        since = first.restarting_since or first.updated_at
        note = f"restarting since {since.strftime('%Y-%m-%d %H:%M:%S %Z').strip()}"
        return f"{note}: {first.error_kind}" if first.error_kind else note

    def stopped_note(self) -> str:
        """Why a stopped stream is stopped and what starts it (for example ``"no
        process runs it: start `manage.py flowwarden_streams run` (or a StreamManager)
        under your process manager"``), or ``""`` when it is not stopped, or disabled
        (``enabled=False``: nothing may run it, as the *disabled* note says)."""
        if self.state != STOPPED or not self.enabled:
            return ""
        run = "manage.py flowwarden_streams run"
        if self.auto_start:
            start = f"start `{run}` (or a StreamManager) under your process manager"
        else:
            start = f"`{run} --stream {self.name}` starts it"
        if self.instances:
            count = len(self.instances)
            processes = f"{count} process{'es' if count > 1 else ''}"
            return (
                f"stopped in the {processes} reporting it (its consumer ended: see their "
                f"logs); restart {'them' if count > 1 else 'it'}, or {start}"
            )
        if self.stale_instances:
            return f"the processes that ran it stopped reporting; {start}"
        return f"no process runs it: {start}"

    def to_json(self, *, details: bool = True) -> dict[str, Any]:
        """The stream's entry in :func:`health_report` (``status`` is the reference's UP/DOWN).

        Without *details*, ``leader`` and ``stale_instances`` give instance keys
        instead of ids, and ``error`` is the :attr:`error_summary`.
        """
        return {
            "state": self.state,
            "status": "UP" if self.state in WORKING else "DOWN",
            "healthy": self.healthy,
            "mode": self.deployment_mode,
            "parallelism": self.parallelism,
            "enabled": self.enabled,
            "auto_start": self.auto_start,
            "paused": self.paused,
            "leader": self.leader if details or self.leader is None else instance_key(self.leader),
            "instances": [instance.to_json(details=details) for instance in self.instances],
            "stale_instances": [
                instance if details else instance_key(instance) for instance in self.stale_instances
            ],
            "last_event_time": _json_value(self.last_event_time),
            "checkpoint_at": _json_value(self.checkpoint_at),
            "checkpoint_age_seconds": self.checkpoint_age_seconds,
            "heartbeat_at": _json_value(self.heartbeat_at),
            "heartbeat_age_seconds": self.heartbeat_age_seconds,
            "dlq_backlog": self.dlq_backlog,
            "in_flight": self.in_flight,
            "watermark_lag": self.watermark_lag,
            "parked_keys": list(self.parked_keys)
            if details and self.details
            else len(self.parked_keys),
            "restart_requested_at": _json_value(self.restart_requested_at),
            "initial_sync": self.initial_sync.to_json() if self.initial_sync else None,
            "error": self.error if details else self.error_summary,
        }


def status_interval() -> float:
    """``FLOWWARDEN["STATUS_INTERVAL"]`` in seconds."""
    return parse_duration(fw_settings.STATUS_INTERVAL)


def stale_before(now: datetime) -> datetime:
    """Worker rows last updated before this time are stale."""
    return now - timedelta(seconds=STALE_AFTER_INTERVALS * status_interval())


def stream_state(instances: Iterable[WorkerStatus], paused: bool) -> tuple[str, str | None]:
    """The stream's state and its leader's instance id, from its fresh worker rows.

    In order: ``running`` when a fresh row runs it (with ``SINGLE_LEADER``, only
    the leader runs it, standbys report ``standby``); ``copying`` while one copies
    the collection (an initial sync) before streaming; ``restarting`` or
    ``starting`` while a process is bringing it up; ``paused`` when an operator
    stopped it; ``crashed`` when a process reports a crash (with nobody running
    it); ``standby`` when processes only wait for the lease; else ``stopped``.
    """
    instances = list(instances)
    states = {instance.state for instance in instances}
    leaders = [i for i in instances if i.role == LEADER]
    # Prefer a running leader; between equals, the freshest report.
    leaders.sort(key=lambda i: (i.state in WORKING, i.updated_at), reverse=True)
    leader = leaders[0].instance_id if leaders else None
    for state in (RUNNING, COPYING, RESTARTING, STARTING):
        if state in states:
            return state, leader
    if paused or PAUSED in states:
        return PAUSED, leader
    for state in (CRASHED, STANDBY):
        if state in states:
            return state, leader
    return STOPPED, leader


def stream_status(
    now: datetime | None = None, registry: StreamRegistry | None = None
) -> list[StreamStatus]:
    """The status of every declared stream, in declaration order.

    Reads the worker and control rows once, then each stream's checkpoint and DLQ
    backlog. A failing checkpoint or DLQ store is reported in that stream's
    ``error``; a failing database (worker rows) or a duplicate declaration raises.
    """
    now = now or timezone.now()
    specs = (registry or stream_registry).specs()
    fresh_after = stale_before(now)
    rows: dict[str, list[Any]] = {}
    for row in StreamWorker.objects.filter(stream_name__in=list(specs)):
        rows.setdefault(row.stream_name, []).append(row)
    controls = {c.stream_name: c for c in StreamControl.objects.filter(stream_name__in=list(specs))}
    return [
        _one_stream(spec, rows.get(name, []), controls.get(name), now, fresh_after)
        for name, spec in specs.items()
    ]


#: The ``StreamStatus`` fields that are the stream's own settings (``StreamSpec``).
_SPEC_FIELDS = ("deployment_mode", "parallelism", "windowed", "enabled", "auto_start")


def _one_stream(
    spec: StreamSpec,
    rows: list[Any],
    control: Any,
    now: datetime,
    fresh_after: datetime,
) -> StreamStatus:
    fresh = tuple(WorkerStatus.from_row(r) for r in rows if r.updated_at >= fresh_after)
    stale = tuple(r.instance_id for r in rows if r.updated_at < fresh_after)
    paused = bool(control and control.paused)
    state, leader = stream_state(fresh, paused)
    # A gone process's last event is still the stream's last event.
    event_times = [r.last_event_at for r in rows if r.last_event_at is not None]
    errors: list[_StoreError] = []
    checkpoint_at, heartbeat_at, progress = _checkpoint_times(spec, errors)
    backlog = _dlq_backlog(spec, errors)
    return StreamStatus(
        name=spec.name,
        state=state,
        **{field: getattr(spec, field) for field in _SPEC_FIELDS},
        paused=paused,
        # An operator's pause is not an outage: a liveness probe must not restart
        # processes because someone stopped a stream on purpose.
        healthy=state in WORKING or paused or not (spec.enabled and spec.auto_start),
        leader=leader,
        instances=fresh,
        stale_instances=stale,
        last_event_time=max(event_times, default=None),
        checkpoint_at=checkpoint_at,
        checkpoint_age_seconds=_age(checkpoint_at, now),
        heartbeat_at=heartbeat_at,
        heartbeat_age_seconds=_age(heartbeat_at, now),
        dlq_backlog=backlog,
        dlq_store=spec.dead_letter_queue.store if spec.dead_letter_queue else None,
        restart_requested_at=control.restart_requested_at if control else None,
        initial_sync=progress,
        error="; ".join(e.text for e in errors) or None,
        error_summary="; ".join(e.summary for e in errors) or None,
    )


@dataclasses.dataclass(frozen=True)
class _StoreError:
    """A store that could not be read: what (``checkpoint store 'default'``) and why."""

    what: str
    exc: Exception

    @property
    def text(self) -> str:
        return f"{self.what}: {self.exc}"

    @property
    def summary(self) -> str:
        return f"{self.what} unavailable ({type(self.exc).__name__})"


def _checkpoint_times(
    spec: StreamSpec, errors: list[_StoreError]
) -> tuple[datetime | None, datetime | None, CopyProgress | None]:
    try:
        saved = checkpoint_stores[spec.checkpoint_store].find(spec.name)
    except Exception as exc:  # one unreachable store must not hide the other streams
        errors.append(_StoreError(f"checkpoint store {spec.checkpoint_store!r}", exc))
        return None, None, None
    if saved is None:
        return None, None, None
    return (
        saved.last_processed_at or saved.last_seen_at,
        saved.last_heartbeat_at,
        copy_progress(saved.initial_sync),
    )


def _dlq_backlog(spec: StreamSpec, errors: list[_StoreError]) -> int | None:
    if spec.dead_letter_queue is None:
        return None
    alias = spec.dead_letter_queue.store
    try:
        count = dlq_stores[alias].count(spec.name)
    except Exception as exc:
        errors.append(_StoreError(f"dead-letter store {alias!r}", exc))
        return None
    # -1: the store cannot count; saying 0 would be a lie.
    return None if count is None or count < 0 else int(count)


def health_report(
    now: datetime | None = None,
    registry: StreamRegistry | None = None,
    *,
    details: bool = True,
) -> dict[str, Any]:
    """``{"healthy": bool, "streams": {name: {...}}}``, ready for ``json.dumps``.

    Healthy when every enabled, auto-start stream is running somewhere. Standby
    instances of a ``SINGLE_LEADER`` stream do not count against health: the
    stream is judged by its leader, wherever it runs. When the status cannot be
    read at all (database down), the report is unhealthy with an ``error``.

    Without *details* (what anonymous callers get), the report has status and
    counts only: see :meth:`StreamStatus.to_json` and :func:`status_error`.
    """
    try:
        statuses = stream_status(now, registry)
    except Exception as exc:
        logger.warning("cannot read the stream status", exc_info=True)
        return {"healthy": False, "streams": {}, "error": status_error(exc, details=details)}
    return {
        "healthy": all(status.healthy for status in statuses),
        "streams": {status.name: status.to_json(details=details) for status in statuses},
    }


def status_error(exc: Exception, *, details: bool = True) -> str:
    """Why the status could not be read: the exception, or without *details* a summary.

    The summary names the exception's class only: a driver's message may carry
    the database's host, port and user.
    """
    if details:
        return f"{type(exc).__name__}: {exc}"
    what = "database unavailable" if isinstance(exc, DatabaseError) else "stream status unavailable"
    return f"{what} ({type(exc).__name__})"


def _age(at: datetime | None, now: datetime) -> float | None:
    return None if at is None else (now - at).total_seconds()


def _json_value(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return value.isoformat() if isinstance(value, datetime) else value
