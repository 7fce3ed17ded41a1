"""Checks of who may read the health details and the metrics (E301, W301, E302; W302
with ``--deploy``) and of the API's password throttle behind proxies (W401, ``--deploy``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks

from ..conf import DEFAULTS, SETTING_NAME, fw_settings


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
    from ..views import HEALTH_DETAILS_RULES, is_permission_name

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
