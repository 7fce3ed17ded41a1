"""The system checks of the ORM snapshot store's ``OPTIONS``: the database alias and
its vendor, the serializer, the encryption keys (never echoed) and the True/False
options; and, for ``check --deploy``, a store that writes plaintext."""

from __future__ import annotations

from collections.abc import Mapping
from importlib.util import find_spec
from typing import Any

from django.conf import settings
from django.core import checks
from django.db import connections

from ..storage.encryption import decode_key
from ..storage.store import snapshot_stores
from ._common import check_serializer_option

SUPPORTED_VENDORS = ("postgresql", "sqlite", "mysql")

#: The ORM store's True/False options: (name, default, the hint for a bad value).
BOOLEAN_OPTIONS = (
    (
        "accept_legacy_envelopes",
        False,
        "False (the default) refuses enc:v1 values until "
        "`manage.py flowwarden_workflows reencrypt` binds them to their run.",
    ),
    (
        "require_encryption",
        True,
        "True (the default) refuses plaintext rows in an encrypting store; "
        "False reads them while you re-save them.",
    ),
)


def check_store_options(alias: str, options: Mapping[str, Any]) -> list[checks.CheckMessage]:
    """``OrmSnapshotStore.check_options``: E006, E007, E005 and E008 for its *options*."""
    where = f'{snapshot_stores.alias_setting(alias)}["OPTIONS"]'
    messages: list[checks.CheckMessage] = []
    using = options.get("using")
    if using is not None and using not in settings.DATABASES:
        messages.append(
            checks.Error(
                f'{where}["using"] = {using!r} is not a database alias.',
                hint=f"Use one of: {', '.join(sorted(settings.DATABASES))}.",
                id="flowwarden_django.E006",
            )
        )
    elif using is not None and connections[using].vendor not in SUPPORTED_VENDORS:
        messages.append(
            checks.Error(
                f'{where}["using"] = {using!r} is a {connections[using].vendor} database, '
                "which OrmSnapshotStore does not support.",
                hint="Use PostgreSQL, SQLite or MySQL/MariaDB.",
                id="flowwarden_django.E007",
            )
        )
    if options.get("serializer") is not None:
        messages.extend(check_serializer_option(where, options["serializer"]))
    if options.get("encryption_keys") is not None:
        messages.extend(_check_keys(where, options["encryption_keys"]))
    for name, default, hint in BOOLEAN_OPTIONS:
        value = options.get(name, default)
        if not isinstance(value, bool):
            messages.append(
                checks.Error(
                    f'{where}["{name}"] = {value!r} is not True or False.',
                    hint=hint,
                    id="flowwarden_django.E008",
                )
            )
    return messages


def check_plaintext(alias: str, options: Mapping[str, Any]) -> list[checks.CheckMessage]:
    """``OrmSnapshotStore.check_deploy_options``: W201 when the store of *alias* writes
    plaintext."""
    if options.get("encryption_keys") is not None:
        return []
    return [
        checks.Warning(
            f"{snapshot_stores.alias_setting(alias)} stores workflow state and metadata "
            "in plaintext.",
            hint='Set its OPTIONS["encryption_keys"] to a list of base64 32-byte keys '
            "(make one with flowwarden_django.workflows.storage.encryption.generate_key()) and "
            'pip install "flowwarden-django[crypto]".',
            id="flowwarden_django.W201",
        )
    ]


def _check_keys(where: str, keys: Any) -> list[checks.CheckMessage]:
    setting = f'{where}["encryption_keys"]'
    if isinstance(keys, str | bytes | bytearray):
        keys = [keys]
    if not isinstance(keys, list | tuple) or not keys:
        return [
            checks.Error(
                f"{setting} must be a key or a non-empty list of keys.",
                hint="Leave it out (or None) to store snapshots in plaintext.",
                id="flowwarden_django.E008",
            )
        ]
    messages = []
    if find_spec("cryptography") is None:
        messages.append(
            checks.Error(
                f"{setting} is set but the cryptography package is not installed.",
                hint='pip install "flowwarden-django[crypto]"',
                id="flowwarden_django.E005",
            )
        )
    for index, key in enumerate(keys):
        try:
            decode_key(key)
        except ValueError as exc:
            # Never echo the key itself.
            messages.append(
                checks.Error(
                    f"{setting}[{index}] {exc}.",
                    hint="Each key is base64 text of 32 random bytes, for example from "
                    "flowwarden_django.workflows.storage.encryption.generate_key().",
                    id="flowwarden_django.E008",
                )
            )
    return messages
