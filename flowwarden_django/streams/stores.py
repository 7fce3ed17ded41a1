"""Backends by alias, configured like ``CACHES``: checkpoint stores, dead-letter
stores and lock services.

``FLOWWARDEN = {"CHECKPOINT_STORES": {"default": {"BACKEND": "...", "OPTIONS": {...}}}}``;
``checkpoint_stores["default"]`` builds the store on first use and keeps one
instance per alias for the whole process (backends are thread-safe). The same
holds for ``dlq_stores`` (``DLQ_STORES``) and ``lock_services`` (``LOCK_SERVICES``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..common.backend_aliases import BackendAliases
from .checkpoint import CheckpointStore
from .dlq import DlqStore
from .locks import LockService

SETTING = 'FLOWWARDEN["CHECKPOINT_STORES"]'


#: Kept under its first name: the checkpoint-store registry.
CheckpointStoreHandler = BackendAliases

checkpoint_stores: BackendAliases[CheckpointStore] = BackendAliases(
    "CHECKPOINT_STORES", CheckpointStore, "checkpoint store"
)

dlq_stores: BackendAliases[DlqStore] = BackendAliases("DLQ_STORES", DlqStore, "dead-letter store")
lock_services: BackendAliases[LockService] = BackendAliases(
    "LOCK_SERVICES", LockService, "lock service"
)


def store_setting(alias: str) -> str:
    """The setting path of one checkpoint-store alias, as messages name it."""
    return checkpoint_stores.alias_setting(alias)


def load_backend_class(alias: str, config: Mapping[str, Any]) -> type[CheckpointStore]:
    """Import the ``BACKEND`` class of one checkpoint-store alias."""
    return checkpoint_stores.load_backend_class(alias, config)


def store_options(alias: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``OPTIONS`` dict of one checkpoint-store alias (empty when absent)."""
    return checkpoint_stores.options(alias, config)


def create_store(alias: str, config: Mapping[str, Any]) -> CheckpointStore:
    """Build the checkpoint store one alias describes."""
    return checkpoint_stores.create(alias, config)
