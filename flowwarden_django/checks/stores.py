"""Checks of the backends behind each alias of ``CHECKPOINT_STORES``, ``DLQ_STORES``,
``LOCK_SERVICES`` and ``SNAPSHOT_STORES`` (E001 to E008, each backend's own option
checks), and, for ``check --deploy``, of the snapshot stores' encryption (W201)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core import checks

from ..common.backend_aliases import BackendAliases
from ..conf import SETTING_NAME
from ..exceptions import InvalidCheckpointStoreError

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
    from ..streams.stores import checkpoint_stores, dlq_stores, lock_services
    from ..workflows.storage.store import snapshot_stores

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


@checks.register(deploy=True)
def check_snapshot_encryption(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``check --deploy``: W201 for each snapshot store that writes plaintext."""
    from ..workflows.storage.store import snapshot_stores

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
