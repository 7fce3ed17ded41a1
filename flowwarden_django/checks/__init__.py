"""System checks: a misconfigured ``FLOWWARDEN`` setting fails ``manage.py check``
with the setting's path and the fix, not with a traceback at first use.

Ids: E001 ``FLOWWARDEN``, ``CHECKPOINT_STORES``, ``DLQ_STORES``, ``LOCK_SERVICES`` or
``SNAPSHOT_STORES`` is not a dict; E002 a backend cannot be imported; E003 a backend is not
of its SPI; E004 ``OPTIONS`` do not fit the backend; E005 an optional extra is missing; E006
an alias named in ``OPTIONS`` does not exist; E007 unsupported database; E008 bad option
value; E009 ``USE_TZ`` is off; E010 a lease or status interval is not a positive duration;
E011 the lease renewal interval is more than half the TTL; E012 a simple setting has
a value of the wrong form; E013 an unknown ``FLOWWARDEN`` key that is a near miss of a
known one (a typo: the default applies in silence); W002 any other unknown key (with
the nearest known one, if any); W203 (``check --deploy`` only) runs fall back to
in-process execution when their provider is unreachable; W001 pymongo (``bson``) is
missing, so no resume token can be stored; W201 (``check --deploy`` only) a snapshot store
writes workflow state in plaintext; E202 ``WORKFLOW_EXECUTION`` names no usable execution
provider; W202 it is ``"celery"`` but no Celery app is loaded; E203 ``TEMPORAL`` is
wrong; E204 ``"temporal"`` without the SDK installed; E301 ``HEALTH_DETAILS``
is not ``"staff"``, ``"none"``, ``"all"`` or a permission of an installed app; W301 no
model declares that permission; W302 (``check --deploy`` only) ``HEALTH_DETAILS`` is
``"all"``; E302 ``METRICS_TOKEN`` is not ``None``, a token or a list of tokens; E210 an entry of
Celery's ``beat_schedule`` that starts workflows cannot (its state template or
arguments are wrong); W204 unfinished runs are on a workflow, or a version of one, this
code does not define; W205 unfinished runs stand
after a step their defined version lacks; E205 ``WORKFLOW_QUEUES`` is wrong (not a
dict, an unknown option, a bad limit or rate, no limit); W206 a defined workflow
declares a queue it does not configure; W207 runs wait for a slot of a queue it no
longer configures; E211 pending approvals have a decision form that no longer loads;
E212 a transactional step's snapshots cannot commit with its writes (not the ORM store,
or not on the runs' database).
Declared streams:
E101-E113, E115-E123 and W101-W107 (``streams/validation.py``); E114 a ``MONGO_CLIENTS``
alias without a MongoDB URL. W401 (``check --deploy`` only) the API's password throttle
counts per IP but ``REST_FRAMEWORK["NUM_PROXIES"]`` is unset, so that count trusts a
client's own ``X-Forwarded-For``. E014 ``DEAD_CONNECTION_TIMEOUT`` is below 3 s;
E015 ``CELERY_VISIBILITY_TIMEOUT`` is below 3 s; E016 a database applied some, not
all, of the migrations a squashed migration replaces;
W501 (``check --deploy`` only) a PostgreSQL database's ``OPTIONS`` lack libpq's keepalive
timings or ``tcp_user_timeout``, so a silent network partition goes unnoticed for
minutes; W510 (``check --deploy`` only) the Celery app's broker or result backend
connections lack the heartbeat, timeouts and keepalives that notice one.

The checks live in one module per area: ``configuration`` (the ``FLOWWARDEN`` setting
itself), ``stores`` (the backends of each alias), ``streams``, ``workflows``,
``approvals``, ``transactional`` (transactional steps), ``queues``, ``endpoints``
(health details, metrics, the API's password throttle), ``network`` (bounds on
silent partitions) and ``migrations`` (the squashed migrations). Importing this package
registers every one of them.
"""

from .approvals import check_approval_forms
from .configuration import (
    check_intervals,
    check_setting_keys,
    check_settings,
    check_time_zone_support,
)
from .endpoints import (
    check_endpoint_access,
    check_password_throttle_proxies,
    check_public_health_details,
)
from .migrations import check_squashed_migrations
from .network import check_postgres_keepalives
from .queues import check_declared_queues, check_runs_on_unknown_queues, check_workflow_queues
from .stores import check_checkpoint_stores, check_snapshot_encryption
from .streams import check_bson_available, check_mongo_clients, check_streams
from .transactional import check_transactional_steps
from .workflows import (
    check_execution_fallback,
    check_scheduled_starts,
    check_stranded_runs,
    check_temporal,
    check_workflow_execution,
)

__all__ = [
    "check_approval_forms",
    "check_bson_available",
    "check_checkpoint_stores",
    "check_declared_queues",
    "check_endpoint_access",
    "check_execution_fallback",
    "check_intervals",
    "check_mongo_clients",
    "check_password_throttle_proxies",
    "check_postgres_keepalives",
    "check_public_health_details",
    "check_runs_on_unknown_queues",
    "check_scheduled_starts",
    "check_setting_keys",
    "check_settings",
    "check_snapshot_encryption",
    "check_squashed_migrations",
    "check_stranded_runs",
    "check_streams",
    "check_temporal",
    "check_time_zone_support",
    "check_transactional_steps",
    "check_workflow_execution",
    "check_workflow_queues",
]
