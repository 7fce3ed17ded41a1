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
after a step their defined version lacks. Declared streams:
E101-E113, E115-E123 and W101-W107 (``streams/validation.py``); E114 a ``MONGO_CLIENTS``
alias without a MongoDB URL. W401 (``check --deploy`` only) the API's password throttle
counts per IP but ``REST_FRAMEWORK["NUM_PROXIES"]`` is unset, so that count trusts a
client's own ``X-Forwarded-For``.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping
from importlib.util import find_spec
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .common.backend_aliases import BackendAliases
from .conf import DEFAULTS, SETTING_NAME, fw_settings
from .exceptions import InvalidCheckpointStoreError


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``FLOWWARDEN`` must be a dict."""
    value = getattr(settings, SETTING_NAME, {})
    if not isinstance(value, Mapping):
        return [
            checks.Error(
                f"{SETTING_NAME} must be a dict, not {type(value).__name__}.",
                hint=f'Write {SETTING_NAME} = {{"CHECKPOINT_STORES": {{...}}}}.',
                id="flowwarden_django.E001",
            )
        ]
    return []


@checks.register()
def check_setting_keys(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E013 for a ``FLOWWARDEN`` key that is a near miss of a known one, W002 for any
    other key the app does not know (with the nearest known one);
    E012 for a mistyped value of a simple key (the stores, clients, durations and the
    endpoint settings have checks of their own)."""
    configured = getattr(settings, SETTING_NAME, {})
    if not isinstance(configured, Mapping):
        return []
    messages: list[checks.CheckMessage] = []
    for key in configured:
        if key in DEFAULTS:
            continue
        close = difflib.get_close_matches(str(key).upper(), list(DEFAULTS), n=1, cutoff=0.8)
        if close:
            # A near miss of a known key is a typo: the default would apply in silence.
            messages.append(
                checks.Error(
                    f"{SETTING_NAME}[{key!r}] is not a flowwarden_django setting: the "
                    f"default of {close[0]!r} applies instead of what you set.",
                    hint=f'Did you mean "{close[0]}"? Rename the key.',
                    id="flowwarden_django.E013",
                )
            )
            continue
        close = difflib.get_close_matches(str(key), list(DEFAULTS), n=1, cutoff=0.6)
        hint = (
            f'Did you mean "{close[0]}"?'
            if close
            else f"The settings are: {', '.join(sorted(DEFAULTS))}."
        )
        messages.append(
            checks.Warning(
                f"{SETTING_NAME}[{key!r}] is not a flowwarden_django setting; it is ignored.",
                hint=hint,
                id="flowwarden_django.W002",
            )
        )
    for key, (valid, form) in _VALUE_FORMS.items():
        if key in configured and not valid(configured[key]):
            messages.append(
                checks.Error(
                    f'{SETTING_NAME}["{key}"] = {configured[key]!r} is not {form}.',
                    hint=f"Use {form}, or leave it out for the default ({DEFAULTS[key]!r}).",
                    id="flowwarden_django.E012",
                )
            )
    return messages


def _positive_duration(value: Any) -> bool:
    from .common.durations import parse_duration

    try:
        return parse_duration(value) > 0
    except ValueError:
        return False


def _instance_id(value: Any) -> bool:
    return value is None or (
        isinstance(value, str) and 0 < len(value) <= 200 and value.strip() and "\x00" not in value
    )


def _password_throttle(value: Any) -> bool:
    """``None``, or a dict of ``"ip"`` and/or ``"username"`` to ``None`` or a rate DRF
    reads with a positive count (``api/throttling.py``)."""
    if value is None:
        return True
    if not isinstance(value, Mapping):
        return False
    return all(
        key in ("ip", "username") and (rate is None or _drf_rate(rate))
        for key, rate in value.items()
    )


def _drf_rate(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    if find_spec("rest_framework") is None:
        return True  # without the drf extra nothing reads it
    from rest_framework.throttling import SimpleRateThrottle

    try:
        count, _duration = SimpleRateThrottle.parse_rate(None, value)  # type: ignore[arg-type]
    except (ValueError, KeyError, IndexError):
        return False
    return count > 0


#: Simple keys: (is the value valid, the expected form).
_VALUE_FORMS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "STREAM_MAX_AWAIT_MS": (
        _positive_duration,
        "a positive number of milliseconds or a duration like '200ms'",
    ),
    "CELERY_RUN_STREAMS": (lambda value: isinstance(value, bool), "True or False"),
    "CELERY_RUN_WORKFLOW_SWEEP": (lambda value: isinstance(value, bool), "True or False"),
    "WORKFLOW_FALLBACK_TO_INPROCESS": (lambda value: isinstance(value, bool), "True or False"),
    "STREAM_RUNNER": (lambda value: value in ("threads", "asyncio"), '"threads" or "asyncio"'),
    "INSTANCE_ID": (_instance_id, "None or a name of 1 to 200 characters"),
    "API_AUTHENTICATION": (
        lambda value: (
            value is None
            or (
                isinstance(value, list | tuple)
                and bool(value)
                and all(isinstance(path, str) and path.count(".") >= 1 for path in value)
            )
        ),
        "None or a non-empty list of authentication classes' dotted paths",
    ),
    "API_PASSWORD_THROTTLE": (
        _password_throttle,
        'None or a dict of "ip" and/or "username" to a rate like "20/min" (or None)',
    ),
    "WORKFLOW_EXECUTION": (
        lambda value: isinstance(value, str) and bool(value.strip()),
        '"inprocess", "celery" or the dotted path of an ExecutionProvider',
    ),
}


@checks.register()
def check_time_zone_support(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Checkpoint timestamps are timezone-aware; the ORM store needs ``USE_TZ``."""
    if settings.USE_TZ:
        return []
    return [
        checks.Error(
            "flowwarden-django needs USE_TZ = True: checkpoint timestamps are "
            "timezone-aware and the ORM store cannot write them otherwise.",
            hint="Set USE_TZ = True in your settings (Django's default since 5.0).",
            id="flowwarden_django.E009",
        )
    ]


@checks.register()
def check_bson_available(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Resume tokens are BSON documents; storing one needs ``bson`` from pymongo."""
    if find_spec("bson") is not None:
        return []
    return [
        checks.Warning(
            "pymongo is not installed: checkpoint stores cannot store resume tokens "
            "(BSON documents), so change streams cannot run.",
            hint='pip install "flowwarden-django[mongo]" (not needed for workflows alone)',
            id="flowwarden_django.W001",
        )
    ]


_EXAMPLES = {
    "CHECKPOINT_STORES": (
        "flowwarden_django.streams.backends.orm.OrmCheckpointStore, "
        "…redis.RedisCheckpointStore, …mongo.MongoCheckpointStore or "
        "…memory.InMemoryCheckpointStore"
    ),
    "DLQ_STORES": (
        "flowwarden_django.streams.backends.orm.OrmDlqStore, …redis.RedisDlqStore, "
        "…mongo.MongoDlqStore or …memory.InMemoryDlqStore"
    ),
    "LOCK_SERVICES": (
        "flowwarden_django.streams.backends.orm.OrmLockService, …redis.RedisLockService, "
        "…mongo.MongoLockService or …memory.InMemoryLockService"
    ),
    "SNAPSHOT_STORES": (
        "flowwarden_django.workflows.backends.orm.OrmSnapshotStore, …memory.InMemorySnapshotStore"
    ),
}


def _registries() -> list[BackendAliases[Any]]:
    from .streams.stores import checkpoint_stores, dlq_stores, lock_services
    from .workflows.storage.store import snapshot_stores

    return [checkpoint_stores, dlq_stores, lock_services, snapshot_stores]


@checks.register()
def check_checkpoint_stores(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every checkpoint store, DLQ store, lock service and snapshot store alias names
    an importable backend with fitting options."""
    if not isinstance(getattr(settings, SETTING_NAME, {}), Mapping):
        return []
    errors: list[checks.CheckMessage] = []
    for registry in _registries():
        configured = registry.settings
        if not isinstance(configured, Mapping):
            example = _EXAMPLES[registry.key].split(",")[0]
            errors.append(
                checks.Error(
                    f"{registry.setting} must be a dict of aliases, not "
                    f"{type(configured).__name__}.",
                    hint=f'Write {{"default": {{"BACKEND": "{example}"}}}}.',
                    id="flowwarden_django.E001",
                )
            )
            continue
        for alias, config in configured.items():
            errors.extend(_check_store(registry, alias, config))
    return errors


def _check_store(
    registry: BackendAliases[Any], alias: str, config: Any
) -> list[checks.CheckMessage]:
    try:
        backend = registry.load_backend_class(alias, config)
    except InvalidCheckpointStoreError as exc:
        base = registry.base.__name__
        hint = f"Use a dotted path to a {base} subclass, for example {_EXAMPLES[registry.key]}."
        code = "E003" if f"not a {base}" in str(exc) else "E002"
        return [checks.Error(str(exc), hint=hint, id=f"flowwarden_django.{code}")]
    try:
        options = registry.options(alias, config)
    except InvalidCheckpointStoreError as exc:
        return [
            checks.Error(
                str(exc),
                hint="OPTIONS maps keyword arguments of the backend.",
                id="flowwarden_django.E004",
            )
        ]
    signature = inspect.signature(backend.__init__)
    try:
        signature.bind(None, **options)
    except TypeError as exc:
        accepted = [
            name for name in list(signature.parameters)[1:] if name not in ("args", "kwargs")
        ]
        return [
            checks.Error(
                f'{registry.alias_setting(alias)}["OPTIONS"] does not fit '
                f"{backend.__name__}: {exc}.",
                hint=f"{backend.__name__} accepts: {', '.join(accepted) or 'no options'}.",
                id="flowwarden_django.E004",
            )
        ]
    return list(backend.check_options(alias, options))


@checks.register()
def check_workflow_execution(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E202 when ``WORKFLOW_EXECUTION`` names no usable provider; W202 when it is the
    Celery provider and no Celery app is loaded: steps would be published with
    Celery's fallback app (amqp://localhost, queue "celery") that no worker may read."""
    from .workflows.execution.providers import InvalidExecutionProviderError, configured_provider

    if not isinstance(getattr(settings, SETTING_NAME, {}), Mapping):
        return []
    try:
        provider = configured_provider()
    except InvalidExecutionProviderError as exc:
        return [
            checks.Error(
                str(exc),
                hint='Use "inprocess", "celery", "temporal" or the dotted path of an '
                "ExecutionProvider.",
                id="flowwarden_django.E202",
            )
        ]
    except ImproperlyConfigured as exc:
        if _uses_temporal():
            return []  # check_temporal names each problem of the TEMPORAL setting
        return [checks.Error(str(exc), id="flowwarden_django.E202")]
    if getattr(provider, "name", "") != "celery" or getattr(provider, "_app", None) is not None:
        return []
    from celery import _state

    if any(app.set_as_current for app in _state._get_active_apps()):
        return []
    return [
        checks.Warning(
            f'{SETTING_NAME}["WORKFLOW_EXECUTION"] is "celery", but no Celery app is loaded: '
            "workflow steps would be sent with Celery's default app, which no worker may read.",
            hint="Load your Celery app when Django starts, as Celery's Django guide does: "
            "in your project package's __init__.py, `from .celery import app as celery_app`.",
            id="flowwarden_django.W202",
        )
    ]


@checks.register(deploy=True)
def check_execution_fallback(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W203 (``check --deploy``): a remote provider is configured, and a run whose
    provider does not answer falls back to running its steps in the calling process
    (a web request, say)."""
    if not isinstance(getattr(settings, SETTING_NAME, {}), Mapping):
        return []
    execution = fw_settings.WORKFLOW_EXECUTION
    if execution in ("inprocess", None) or not fw_settings.WORKFLOW_FALLBACK_TO_INPROCESS:
        return []
    return [
        checks.Warning(
            f'{SETTING_NAME}["WORKFLOW_EXECUTION"] is {execution!r}, but when it does not '
            "answer, runs fall back to running their steps in the calling process (inside "
            "a web request, say).",
            hint=f'Set {SETTING_NAME}["WORKFLOW_FALLBACK_TO_INPROCESS"] = False to refuse '
            "(ExecutionUnavailableError; a started run is continued by the sweep later).",
            id="flowwarden_django.W203",
        )
    ]


def _uses_temporal() -> bool:
    value = getattr(settings, SETTING_NAME, {}).get("WORKFLOW_EXECUTION")
    return value == "temporal" or (
        isinstance(value, str) and value.startswith("flowwarden_django.integrations.temporal.")
    )


@checks.register()
def check_temporal(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E203 for each problem of ``FLOWWARDEN["TEMPORAL"]``; E204 when
    ``WORKFLOW_EXECUTION`` is ``"temporal"`` and temporalio is not installed."""
    from .integrations.temporal.config import parse

    configured = getattr(settings, SETTING_NAME, {})
    if not isinstance(configured, Mapping):
        return []
    messages: list[checks.CheckMessage] = [
        checks.Error(
            problem,
            hint='See "Workflows on Temporal" in the README for the keys and their forms.',
            id="flowwarden_django.E203",
        )
        for problem in parse(configured.get("TEMPORAL"))[1]
    ]
    if _uses_temporal() and find_spec("temporalio") is None:
        messages.append(
            checks.Error(
                f'{SETTING_NAME}["WORKFLOW_EXECUTION"] is "temporal", but the Temporal SDK '
                "(temporalio) is not installed.",
                hint='pip install "flowwarden-django[temporal]"',
                id="flowwarden_django.E204",
            )
        )
    return messages


@checks.register(deploy=True)
def check_snapshot_encryption(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``check --deploy``: W201 for each snapshot store that writes plaintext."""
    from .workflows.storage.store import snapshot_stores

    if not isinstance(getattr(settings, SETTING_NAME, {}), Mapping):
        return []
    configured = snapshot_stores.settings
    if not isinstance(configured, Mapping):
        return []
    messages: list[checks.CheckMessage] = []
    for alias, config in configured.items():
        try:
            backend = snapshot_stores.load_backend_class(alias, config)
            options = snapshot_stores.options(alias, config)
        except InvalidCheckpointStoreError:
            continue  # reported by check_checkpoint_stores
        check = getattr(backend, "check_deploy_options", None)
        if check is not None:
            messages.extend(check(alias, options))
    return messages


@checks.register()
def check_streams(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every declared stream is valid: each message names the stream and the attribute."""
    from .streams.registry import stream_registry
    from .streams.validation import validate_all

    declarations = stream_registry.declarations()
    messages: list[checks.CheckMessage] = []
    for problem in validate_all(declarations):
        level = checks.Error if problem.level == "error" else checks.Warning
        messages.append(
            level(problem.text(), hint=problem.hint or None, id=f"flowwarden_django.{problem.code}")
        )
    if declarations and find_spec("pymongo") is None:
        messages.append(
            checks.Error(
                f"{len(declarations)} change stream(s) declared but pymongo is not installed.",
                hint='pip install "flowwarden-django[mongo]"',
                id="flowwarden_django.E005",
            )
        )
    return messages


@checks.register()
def check_mongo_clients(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Each ``FLOWWARDEN["MONGO_CLIENTS"]`` alias has a MongoDB ``URL``."""
    if not isinstance(getattr(settings, SETTING_NAME, {}), Mapping):
        return []
    clients = fw_settings.MONGO_CLIENTS
    if not isinstance(clients, Mapping):
        return [
            checks.Error(
                f'{SETTING_NAME}["MONGO_CLIENTS"] must be a dict of aliases.',
                hint='Write {"default": {"URL": "mongodb://host:27017/?replicaSet=rs0"}}.',
                id="flowwarden_django.E114",
            )
        ]
    errors: list[checks.CheckMessage] = []
    for alias, config in clients.items():
        url = config.get("URL") if isinstance(config, Mapping) else None
        options = config.get("OPTIONS", {}) if isinstance(config, Mapping) else None
        if not isinstance(url, str) or not url.startswith(("mongodb://", "mongodb+srv://")):
            errors.append(
                checks.Error(
                    f'{SETTING_NAME}["MONGO_CLIENTS"]["{alias}"]["URL"] is {url!r}, not a '
                    "MongoDB connection string.",
                    hint='Use "mongodb://host:27017/?replicaSet=rs0".',
                    id="flowwarden_django.E114",
                )
            )
        elif not isinstance(options, Mapping):
            errors.append(
                checks.Error(
                    f'{SETTING_NAME}["MONGO_CLIENTS"]["{alias}"]["OPTIONS"] must be a dict of '
                    "pymongo.MongoClient keyword arguments.",
                    id="flowwarden_django.E114",
                )
            )
    return errors


_DURATION_SETTINGS = (
    "LEADER_LEASE_TTL",
    "LEADER_RENEW_INTERVAL",
    "STANDBY_POLL_INTERVAL",
    "STATUS_INTERVAL",
    "WORKFLOW_RUN_LEASE",
    "WORKFLOW_RECOVER_AFTER",
    "WORKFLOW_SWEEP_INTERVAL",
)


@checks.register()
def check_intervals(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Lease and status intervals are positive durations, and a leader renews its lease
    well before it expires."""
    from .common.durations import parse_duration

    if not isinstance(getattr(settings, SETTING_NAME, {}), Mapping):
        return []
    values: dict[str, float] = {}
    errors: list[checks.CheckMessage] = []
    for key in _DURATION_SETTINGS:
        raw = getattr(fw_settings, key)
        try:
            values[key] = parse_duration(raw)
        except (TypeError, ValueError):
            values[key] = -1
        if values[key] <= 0:
            errors.append(
                checks.Error(
                    f'{SETTING_NAME}["{key}"] = {raw!r} is not a positive duration.',
                    hint='Use a number of seconds or a string like "500ms", "15s" or "2m".',
                    id="flowwarden_django.E010",
                )
            )
    ttl, renew = values["LEADER_LEASE_TTL"], values["LEADER_RENEW_INTERVAL"]
    if not errors and renew * 2 > ttl:
        errors.append(
            checks.Error(
                f'{SETTING_NAME}["LEADER_RENEW_INTERVAL"] ({renew:g} s) must be at most half '
                f'of {SETTING_NAME}["LEADER_LEASE_TTL"] ({ttl:g} s): one failed renewal would '
                "otherwise lose the lease.",
                hint="The defaults are a 60 s TTL renewed every 15 s.",
                id="flowwarden_django.E011",
            )
        )
    return errors


@checks.register()
def check_endpoint_access(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Who may read the health details and the metrics: ``HEALTH_DETAILS`` is a rule or
    a declared permission, ``METRICS_TOKEN`` is ``None``, a token or a list of tokens."""
    if not isinstance(getattr(settings, SETTING_NAME, {}), Mapping):
        return []
    return _check_health_details(fw_settings.HEALTH_DETAILS) + _check_metrics_token(
        fw_settings.METRICS_TOKEN
    )


def _check_health_details(value: Any) -> list[checks.CheckMessage]:
    from .views import HEALTH_DETAILS_RULES, is_permission_name

    if value in HEALTH_DETAILS_RULES:
        return []
    setting = f'{SETTING_NAME}["HEALTH_DETAILS"]'
    declared = _declared_permissions(value.split(".")[0]) if is_permission_name(value) else None
    if declared is None:
        return [
            checks.Error(
                f"{setting} = {value!r} is not a rule nor a permission of an installed app: "
                "nobody gets the health details.",
                hint='Use "staff" (the default), "none", "all" or a permission '
                '"app_label.codename", such as "flowwarden_django.view_streamworker".',
                id="flowwarden_django.E301",
            )
        ]
    if value.split(".", 1)[1] not in declared:
        return [
            checks.Warning(
                f"{setting} = {value!r}: no model of {value.split('.')[0]!r} declares "
                "this permission, so only superusers get the health details.",
                hint="Check the codename, or declare it in a model's Meta.permissions.",
                id="flowwarden_django.W301",
            )
        ]
    return []


def _declared_permissions(app_label: str) -> set[str] | None:
    """The codenames of *app_label*'s models' permissions; ``None`` if no such app."""
    try:
        config = apps.get_app_config(app_label)
    except LookupError:
        return None
    codenames: set[str] = set()
    for model in config.get_models():
        opts = model._meta
        codenames.update(f"{action}_{opts.model_name}" for action in opts.default_permissions)
        codenames.update(codename for codename, _name in opts.permissions)
    return codenames


def _is_metrics_token_setting(value: Any) -> bool:
    """``None``, or one or more non-empty tokens without surrounding spaces."""
    if value is None:
        return True
    tokens = [value] if isinstance(value, str) else value
    if not isinstance(tokens, list | tuple) or not tokens:
        return False
    return all(isinstance(token, str) and token and token == token.strip() for token in tokens)


def _check_metrics_token(value: Any) -> list[checks.CheckMessage]:
    if _is_metrics_token_setting(value):
        return []
    return [
        checks.Error(
            f'{SETTING_NAME}["METRICS_TOKEN"] = {value!r} is not a token: '
            "/flowwarden/metrics/ refuses every request.",
            hint="Use None (open metrics), a non-empty string without surrounding spaces, "
            'or a list of them to rotate, e.g. os.environ["FLOWWARDEN_METRICS_TOKEN"].',
            id="flowwarden_django.E302",
        )
    ]


@checks.register(deploy=True)
def check_public_health_details(
    app_configs: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """``check --deploy``: W302 when anyone may read the health details."""
    if not isinstance(getattr(settings, SETTING_NAME, {}), Mapping):
        return []
    if fw_settings.HEALTH_DETAILS != "all":
        return []
    return [
        checks.Warning(
            f'{SETTING_NAME}["HEALTH_DETAILS"] is "all": /flowwarden/health/ shows anyone '
            "the error texts (which may quote event data and connection strings) and the "
            "instance ids (host names).",
            hint='Use "staff" (the default) or a permission, and give the monitoring '
            "that needs details a staff account.",
            id="flowwarden_django.W302",
        )
    ]


@checks.register(deploy=True)
def check_password_throttle_proxies(
    app_configs: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """``check --deploy``: W401 when the password throttle counts per IP but DRF takes
    the client IP from a client's own ``X-Forwarded-For`` (``NUM_PROXIES`` unset)."""
    if not apps.is_installed("rest_framework"):
        return []
    if not isinstance(getattr(settings, SETTING_NAME, {}), Mapping):
        return []
    throttle = fw_settings.API_PASSWORD_THROTTLE
    if not isinstance(throttle, Mapping):
        return []
    if {**DEFAULTS["API_PASSWORD_THROTTLE"], **throttle}.get("ip") is None:
        return []
    drf = getattr(settings, "REST_FRAMEWORK", None)
    if isinstance(drf, Mapping) and drf.get("NUM_PROXIES") is not None:
        return []
    return [
        checks.Warning(
            f'{SETTING_NAME}["API_PASSWORD_THROTTLE"] counts failed passwords per client '
            'IP, but REST_FRAMEWORK["NUM_PROXIES"] is not set: DRF then takes the IP from '
            "X-Forwarded-For as the client sends it, so a client can name a new address "
            "for each guess (the per-username count still holds).",
            hint='Set REST_FRAMEWORK["NUM_PROXIES"] to the number of reverse proxies in '
            'front of Django (0 for none), or turn the per-IP half off with {"ip": None}.',
            id="flowwarden_django.W401",
        )
    ]


@checks.register()
def check_stranded_runs(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W204 for each workflow version that unfinished runs are on and this code does
    not define (saying so when it defines no version of that workflow at all); W205
    for runs that stand after a step their defined version lacks. One grouped query
    of the run table (skipped while it cannot be read: before ``migrate``, without a
    database; and when the caller names the databases checks may read and the runs'
    database is not one of them)."""
    from django.db import DatabaseError

    from .workflows.operations.versions import versions_in_use
    from .workflows.runs.records import RunRecords

    databases = kwargs.get("databases")
    runs_db = RunRecords().db
    # ``manage.py check`` passes None (every check runs); a caller that names the
    # databases checks may use (the test runner, ``run_checks(databases=[])``) is
    # obeyed.
    if databases is not None and runs_db not in databases:
        return []
    try:
        in_use = versions_in_use()
    except DatabaseError:
        return []
    from .workflows.definition.registry import workflow_registry

    command = "manage.py flowwarden_workflows"
    messages: list[checks.CheckMessage] = []
    for row in in_use:
        runs = f"{row.total} unfinished run{'s' if row.total != 1 else ''}"
        if not row.defined and not workflow_registry.versions(row.workflow):
            messages.append(
                checks.Warning(
                    f"{runs} of workflow {row.workflow!r}, which this process does not "
                    "define at all: this process cannot continue them (a decision made "
                    "here is recorded, but the run goes on only where the workflow is "
                    "defined).",
                    hint="Define it with Workflow.define() in an installed app's "
                    "workflows.py, which every process imports at start-up (the web "
                    "process, the workers, the commands); a workflow defined only in a "
                    f"shell is unknown elsewhere. If it is gone for good, `{command} "
                    "cancel` its runs.",
                    id="flowwarden_django.W204",
                )
            )
            continue
        if not row.defined:
            apply = (
                f"run `{command} upgrade` to apply the declared upgrade ({row.upgrade})"
                if row.upgrade
                else "or declare an upgrade from it (Workflow.define_upgrade) and run "
                f"`{command} upgrade`"
            )
            messages.append(
                checks.Warning(
                    f"{runs} of workflow {row.workflow!r} {'is' if row.total == 1 else 'are'} "
                    f"on version {row.version}, "
                    "which this code does not define: they cannot continue here.",
                    hint=f"Keep version {row.version} defined beside the new one until its "
                    f"runs finish, {apply}. `{command} versions` lists the versions in use.",
                    id="flowwarden_django.W204",
                )
            )
            continue
        missing = row.missing_steps()
        if missing:
            steps = ", ".join(f"{step!r} ({count})" for step, count in sorted(missing.items()))
            messages.append(
                checks.Warning(
                    f"Unfinished runs of version {row.version} of workflow {row.workflow!r} "
                    f"stand after steps this code's version {row.version} lacks: {steps}; "
                    "they would wait as needs_upgrade.",
                    hint="Give a changed definition a new version (Workflow.define(..., "
                    "version=N)) and keep the old one as it was, or declare an upgrade "
                    f"that maps those steps and run `{command} upgrade`.",
                    id="flowwarden_django.W205",
                )
            )
    return messages


@checks.register()
def check_scheduled_starts(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E210: an entry of the loaded Celery app's ``beat_schedule`` that starts workflows
    names no workflow, another schedule, or a state template that cannot format."""
    if find_spec("celery") is None:
        return []
    from celery import _state

    from .workflows.operations.schedule_ticks import ScheduleError, check_state_template

    start_task = "flowwarden_django.start_scheduled_workflow"
    errors: list[checks.CheckMessage] = []
    for app in _state._get_active_apps():
        if not app.set_as_current:
            continue
        for name, entry in (app.conf.beat_schedule or {}).items():
            if not isinstance(entry, Mapping) or entry.get("task") != start_task:
                continue
            arguments = entry.get("kwargs") or {}
            headers = (entry.get("options") or {}).get("headers") or {}
            sent_name = arguments.get("schedule") or headers.get("periodic_task_name")
            problem = None
            if not isinstance(arguments.get("workflow"), str):
                problem = 'its kwargs name no "workflow"'
            elif sent_name != name:
                problem = f"its kwargs name the schedule {sent_name!r}, not {name!r}"
            else:
                try:
                    check_state_template(arguments.get("state"))
                except ScheduleError as exc:
                    problem = str(exc)
            if problem:
                errors.append(
                    checks.Error(
                        f"beat_schedule entry {name!r} cannot start its workflow: {problem}.",
                        hint="Make the entry with flowwarden_django.integrations.celery."
                        "schedules.beat_schedule_entry(), which checks it.",
                        id="flowwarden_django.E210",
                    )
                )
    return errors
