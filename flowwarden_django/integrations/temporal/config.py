"""``FLOWWARDEN["TEMPORAL"]``: where the Temporal server is and how steps are scheduled.

::

    FLOWWARDEN = {
        "WORKFLOW_EXECUTION": "temporal",
        "TEMPORAL": {
            "TARGET": "127.0.0.1:7233",   # host:port of the frontend
            "NAMESPACE": "default",
            "TASK_QUEUE": "flowwarden",
            "STEP_TIMEOUT": "10m",        # start-to-close of a step without its own timeout
            "HEARTBEAT_TIMEOUT": "10s",   # a step's worker is taken for dead after this
            "CONNECT_TIMEOUT": "2s",      # connecting, and the health check
            "CALL_TIMEOUT": "10s",        # starting or signalling a workflow
            "LOCAL_ACTIVITY_TIMEOUT": "5s",  # steps with a timeout up to this: local
        },
    }

Durations take the app's usual forms (``"500ms"``, ``"30s"``, ``"2m"``, a number of
seconds). ``LOCAL_ACTIVITY_TIMEOUT`` may be ``0``: then only steps marked
``short=True`` run as local activities.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ...common.durations import parse_duration
from ...conf import SETTING_NAME, fw_settings

SETTING = f'{SETTING_NAME}["TEMPORAL"]'
_HOST_PORT = re.compile(r"^[A-Za-z0-9_.\-]+:\d{1,5}$|^\[[0-9A-Fa-f:]+\]:\d{1,5}$")
_TEXT_KEYS = {"TARGET": "target", "NAMESPACE": "namespace", "TASK_QUEUE": "task_queue"}
_DURATION_KEYS = {
    "STEP_TIMEOUT": "step_timeout",
    "HEARTBEAT_TIMEOUT": "heartbeat_timeout",
    "CONNECT_TIMEOUT": "connect_timeout",
    "CALL_TIMEOUT": "call_timeout",
    "LOCAL_ACTIVITY_TIMEOUT": "local_activity_timeout",
}
#: Duration keys that may be 0 (off).
_MAY_BE_ZERO = {"LOCAL_ACTIVITY_TIMEOUT"}


@dataclasses.dataclass(frozen=True)
class TemporalConfig:
    """The ``TEMPORAL`` setting, read and checked (durations in seconds)."""

    target: str = "127.0.0.1:7233"
    namespace: str = "default"
    task_queue: str = "flowwarden"
    step_timeout: float = 600.0
    heartbeat_timeout: float = 10.0
    connect_timeout: float = 2.0
    call_timeout: float = 10.0
    #: Steps whose own ``timeout`` is at most this many seconds run as local activities.
    local_activity_timeout: float = 5.0

    @classmethod
    def from_settings(cls) -> TemporalConfig:
        """The configured values; ``ImproperlyConfigured`` naming every problem."""
        value = fw_settings.TEMPORAL
        for read, config in _last_parsed:  # read for every step: parsed once
            if read is value:
                return config
        config, errors = parse(value)
        if errors:
            raise ImproperlyConfigured("; ".join(errors))
        _last_parsed[:] = [(value, config)]
        return config


#: The last ``TEMPORAL`` setting read and its config (another value, as
#: ``override_settings`` sets, is parsed again).
_last_parsed: list[tuple[Any, TemporalConfig]] = []


def parse(value: Any) -> tuple[TemporalConfig, list[str]]:
    """Read a ``TEMPORAL`` value: the config (defaults where a value is wrong) and one
    message per problem, each naming the key."""
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        return TemporalConfig(), [f"{SETTING} must be a dict, not {type(value).__name__}"]
    errors: list[str] = []
    fields: dict[str, Any] = {}
    unknown = sorted(set(value) - set(_TEXT_KEYS) - set(_DURATION_KEYS))
    if unknown:
        known = ", ".join(sorted([*_TEXT_KEYS, *_DURATION_KEYS]))
        errors.append(
            f"{SETTING} has unknown keys {', '.join(map(repr, unknown))} (known: {known})"
        )
    for key, field in _TEXT_KEYS.items():
        if key not in value:
            continue
        text = value[key]
        if not isinstance(text, str) or not text.strip():
            errors.append(f'{SETTING}["{key}"] must be a non-empty string, not {text!r}')
        elif key == "TARGET" and not _HOST_PORT.match(text):
            errors.append(
                f'{SETTING}["TARGET"] = {text!r} is not host:port (like "127.0.0.1:7233")'
            )
        else:
            fields[field] = text
    for key, field in _DURATION_KEYS.items():
        if key not in value:
            continue
        try:
            seconds = parse_duration(value[key])
        except ValueError as exc:
            errors.append(f'{SETTING}["{key}"]: {exc}')
            continue
        if seconds < 0 or (seconds == 0 and key not in _MAY_BE_ZERO):
            at_least = "0 seconds or more" if key in _MAY_BE_ZERO else "more than 0 seconds"
            errors.append(f'{SETTING}["{key}"] must be {at_least}')
        else:
            fields[field] = seconds
    return TemporalConfig(**fields), errors
