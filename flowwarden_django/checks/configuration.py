"""Checks of the ``FLOWWARDEN`` setting itself: a dict (E001), its keys (E013, W002),
the forms of its simple values (E012), its durations (E010, E011, E014), and ``USE_TZ``
(E009)."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from importlib.util import find_spec
from typing import Any

from django.conf import settings
from django.core import checks

from ..conf import DEFAULTS, SETTING_NAME, fw_settings


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
    from ..common.durations import parse_duration

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


def _approval_emails(value: Any) -> bool:
    from ..workflows.waiting.approvals.emails import valid_email_setting

    return valid_email_setting(value)


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
    "APPROVAL_EMAILS": (
        lambda value: _approval_emails(value),
        "None, True, False or a dict of FROM_EMAIL, BASE_URL (http:// or https://), "
        "URL_NAME and SUBJECT_PREFIX strings",
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


_DURATION_SETTINGS = (
    "LEADER_LEASE_TTL",
    "LEADER_RENEW_INTERVAL",
    "STANDBY_POLL_INTERVAL",
    "STATUS_INTERVAL",
    "WORKFLOW_RUN_LEASE",
    "WORKFLOW_RECOVER_AFTER",
    "WORKFLOW_SWEEP_INTERVAL",
    "WORKFLOW_QUEUE_STALE_AFTER",
    "DEAD_CONNECTION_TIMEOUT",
    "STREAM_EVENT_TIMEOUT",
)

#: Keepalive timings are whole seconds: a shorter bound cannot be kept.
MIN_DEAD_CONNECTION_TIMEOUT = 3.0


@checks.register()
def check_intervals(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Lease and status intervals are positive durations, and a leader renews its lease
    well before it expires."""
    from ..common.durations import parse_duration

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
    errors.extend(_visibility_timeout_errors())
    dead = values["DEAD_CONNECTION_TIMEOUT"]
    if 0 < dead < MIN_DEAD_CONNECTION_TIMEOUT:
        errors.append(
            checks.Error(
                f'{SETTING_NAME}["DEAD_CONNECTION_TIMEOUT"] ({dead:g} s) is below '
                f"{MIN_DEAD_CONNECTION_TIMEOUT:g} s: TCP keepalives count in whole seconds, "
                "and a busy server would be taken for a dead one.",
                hint='The default is "30s"; anything from "3s" up works.',
                id="flowwarden_django.E014",
            )
        )
    return errors


#: A worker renews its messages' visibility every third of the timeout, at least
#: every second: a shorter timeout would take a busy worker's messages from it.
MIN_CELERY_VISIBILITY_TIMEOUT = 3.0


def _visibility_timeout_errors() -> list[checks.CheckMessage]:
    """``CELERY_VISIBILITY_TIMEOUT``: None, or a duration of 3 s or more (E010, E015)."""
    from ..common.durations import parse_duration

    raw = fw_settings.CELERY_VISIBILITY_TIMEOUT
    if raw is None:
        return []
    try:
        value = parse_duration(raw)
    except (TypeError, ValueError):
        value = -1
    if value <= 0:
        return [
            checks.Error(
                f'{SETTING_NAME}["CELERY_VISIBILITY_TIMEOUT"] = {raw!r} is neither None nor a '
                "positive duration.",
                hint='Use None (kombu\'s 1 hour, no renewal) or a duration like "10s".',
                id="flowwarden_django.E010",
            )
        ]
    if value < MIN_CELERY_VISIBILITY_TIMEOUT:
        return [
            checks.Error(
                f'{SETTING_NAME}["CELERY_VISIBILITY_TIMEOUT"] ({value:g} s) is below '
                f"{MIN_CELERY_VISIBILITY_TIMEOUT:g} s: a worker renews its messages every "
                "third of it, and a busy worker would lose them to another one.",
                hint='The default is "10s"; anything from "3s" up works.',
                id="flowwarden_django.E015",
            )
        ]
    return []
