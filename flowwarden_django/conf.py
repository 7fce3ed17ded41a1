"""The app's settings: one ``FLOWWARDEN`` dict read lazily, with defaults.

Values are looked up on first access and cached; the cache is dropped whenever
``FLOWWARDEN`` changes (``override_settings`` in tests), see ``signals.py``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings

SETTING_NAME = "FLOWWARDEN"

DEFAULT_CHECKPOINT_BACKEND = "flowwarden_django.streams.backends.orm.OrmCheckpointStore"
DEFAULT_DLQ_BACKEND = "flowwarden_django.streams.backends.orm.OrmDlqStore"
DEFAULT_LOCK_BACKEND = "flowwarden_django.streams.backends.orm.OrmLockService"
DEFAULT_SNAPSHOT_BACKEND = "flowwarden_django.workflows.backends.orm.OrmSnapshotStore"

DEFAULTS: dict[str, Any] = {
    # Checkpoint stores by alias, shaped like CACHES: {"BACKEND": dotted path, "OPTIONS": {...}}.
    "CHECKPOINT_STORES": {"default": {"BACKEND": DEFAULT_CHECKPOINT_BACKEND}},
    # MongoDB clients by alias: {"URL": "mongodb://...", "OPTIONS": {pymongo kwargs}}.
    "MONGO_CLIENTS": {},
    # How long one poll of a change stream waits on the server when idle (getMore maxTimeMS).
    "STREAM_MAX_AWAIT_MS": 1000,
    # How a process runs its streams: "threads" (one thread a stream) or "asyncio" (every
    # stream a task on one event loop, pymongo's async driver; `run --asyncio`).
    "STREAM_RUNNER": "threads",
    # Dead-letter stores and lock services by alias, shaped like CHECKPOINT_STORES.
    "DLQ_STORES": {"default": {"BACKEND": DEFAULT_DLQ_BACKEND}},
    "LOCK_SERVICES": {"default": {"BACKEND": DEFAULT_LOCK_BACKEND}},
    # SINGLE_LEADER streams: lease TTL, leader renewal and standby poll intervals.
    "LEADER_LEASE_TTL": "60s",
    "LEADER_RENEW_INTERVAL": "15s",
    "STANDBY_POLL_INTERVAL": "20s",
    # How often each process publishes its streams' status and reads operator requests.
    "STATUS_INTERVAL": "5s",
    # This process's name in leases and status rows; None = "<hostname>:<pid>".
    "INSTANCE_ID": None,
    # Run the registered streams inside every `celery worker` (integrations.celery).
    "CELERY_RUN_STREAMS": False,
    # Workflow snapshot stores by alias, shaped like CHECKPOINT_STORES.
    "SNAPSHOT_STORES": {"default": {"BACKEND": DEFAULT_SNAPSHOT_BACKEND}},
    # Where workflow steps run: "inprocess", "celery", "temporal" or an ExecutionProvider
    # dotted path.
    "WORKFLOW_EXECUTION": "inprocess",
    # When the provider (Celery's broker, Temporal) does not answer: run the workflow in
    # the calling process (True), or raise ExecutionUnavailableError (False).
    "WORKFLOW_FALLBACK_TO_INPROCESS": True,
    # FLOWWARDEN["TEMPORAL"]: the Temporal provider (integrations/temporal/config.py).
    "TEMPORAL": {},
    # How long a runner's claim on a workflow run outlives its last renewal: the
    # runner's process renews it every quarter of this while a step runs, so only a
    # dead runner's claim runs out (and its run is continued).
    "WORKFLOW_RUN_LEASE": "10s",
    # How often the recovery sweep runs where it runs on its own: in Celery workers
    # (WORKFLOW_EXECUTION "celery"), flowwarden_temporal_worker and
    # `flowwarden_workflows recover --every`.
    "WORKFLOW_SWEEP_INTERVAL": "2s",
    # Run the recovery sweep inside every `celery worker` when WORKFLOW_EXECUTION is
    # "celery" (integrations.celery).
    "CELERY_RUN_WORKFLOW_SWEEP": True,
    # The recovery sweep continues a running run that no runner holds and that has not
    # moved for this long (its next step was never queued, or was lost).
    "WORKFLOW_RECOVER_AFTER": "10s",
    # Workflow queues by name: concurrency, worker_concurrency, rate, priority,
    # partitioned, scope (workflows/queues/settings.py).
    "WORKFLOW_QUEUES": {},
    # /flowwarden/health/ reports a queue whose oldest waiting step waits longer.
    "WORKFLOW_QUEUE_STALE_AFTER": "5m",
    # Email approvers on an approval's request, assignment, reminder and escalation:
    # None/False (off), True, or a dict of FROM_EMAIL, BASE_URL, URL_NAME and
    # SUBJECT_PREFIX (workflows/waiting/approvals/emails.py).
    "APPROVAL_EMAILS": None,
    # Who gets error texts and instance ids from /flowwarden/health/ (others get status and
    # counts): "staff" (active staff users), "none", "all" (anyone, even anonymous) or a
    # permission "app_label.codename".
    "HEALTH_DETAILS": "staff",
    # The REST API's authentication classes (dotted paths); None: a token (with
    # rest_framework.authtoken), HTTP Basic and the session (api/authentication.py).
    "API_AUTHENTICATION": None,
    # Failed password attempts (POST v1/token/, HTTP Basic) allowed per client IP and per
    # username tried, as DRF rates; past either, password attempts get 429 until the
    # window moves on (api/throttling.py). A key's None turns that half off; None: no limit.
    "API_PASSWORD_THROTTLE": {"ip": "20/min", "username": "10/hour"},
    # When set, /flowwarden/metrics/ needs "Authorization: Bearer <token>"; a list of tokens
    # accepts each (to rotate). None: open, as a scrape target usually is.
    "METRICS_TOKEN": None,
    # How long a silent network partition (no reset: a link or a NAT entry gone) may go
    # unnoticed on a connection the package opens: Redis clients' socket timeouts and
    # keepalives derive from it, and `check --deploy` (W501) asks for libpq keepalives
    # and tcp_user_timeout within it on DATABASES (common/network.py).
    "DEAD_CONNECTION_TIMEOUT": "30s",
    # How long a stream with execution="celery" waits for a worker's answer to one event
    # before it restarts from its anchor and sends the event again (a message the broker
    # lost).
    "STREAM_EVENT_TIMEOUT": "10m",
    # Celery workers on a Redis broker: the transport's visibility_timeout, which each
    # worker renews for the messages it holds, so a message taken by a worker that died
    # comes back this long after its last renewal (integrations/celery/visibility.py).
    # None: kombu's (1 hour), no renewal.
    "CELERY_VISIBILITY_TIMEOUT": "10s",
}


class FlowwardenSettings:
    """Attribute access to ``settings.FLOWWARDEN`` with the app's defaults filled in."""

    def __init__(self, defaults: dict[str, Any]) -> None:
        self._defaults = defaults
        self._cached: set[str] = set()

    @property
    def user_settings(self) -> dict[str, Any]:
        value = getattr(django_settings, SETTING_NAME, None) or {}
        if not isinstance(value, dict):
            return {}
        return value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self._defaults:
            raise AttributeError(f"Invalid {SETTING_NAME} setting: {name!r}")
        value = self.user_settings.get(name, self._defaults[name])
        self._cached.add(name)
        setattr(self, name, value)
        return value

    def reload(self) -> None:
        """Forget cached values so the next access reads ``settings.FLOWWARDEN`` again."""
        for name in self._cached:
            delattr(self, name)
        self._cached.clear()


fw_settings = FlowwardenSettings(DEFAULTS)
