"""Checks of the change streams: pymongo for resume tokens (W001), the declared streams
(``streams/validation.py``; E005 without pymongo) and the ``MONGO_CLIENTS`` aliases (E114)."""

from __future__ import annotations

from collections.abc import Mapping
from importlib.util import find_spec
from typing import Any

from django.conf import settings
from django.core import checks

from ..conf import SETTING_NAME, fw_settings


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


@checks.register()
def check_streams(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every declared stream is valid: each message names the stream and the attribute."""
    from ..streams.registry import stream_registry
    from ..streams.validation import validate_all

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
