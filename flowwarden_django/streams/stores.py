"""Checkpoint stores by alias, configured like ``CACHES``.

``FLOWWARDEN = {"CHECKPOINT_STORES": {"default": {"BACKEND": "...", "OPTIONS": {...}}}}``;
``checkpoint_stores["default"]`` builds the store on first use and keeps one
instance per alias for the whole process (stores are thread-safe).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

from django.utils.module_loading import import_string

from ..conf import fw_settings
from ..exceptions import InvalidCheckpointStoreError
from .checkpoint import CheckpointStore

SETTING = 'FLOWWARDEN["CHECKPOINT_STORES"]'


def store_setting(alias: str) -> str:
    """The setting path of one alias, as messages name it."""
    return f'{SETTING}["{alias}"]'


def load_backend_class(alias: str, config: Mapping[str, Any]) -> type[CheckpointStore]:
    """Import the ``BACKEND`` class of one alias, or raise a message naming the setting."""
    if not isinstance(config, Mapping):
        raise InvalidCheckpointStoreError(
            f"{store_setting(alias)} must be a dict with a BACKEND key"
        )
    path = config.get("BACKEND")
    if not isinstance(path, str) or not path:
        raise InvalidCheckpointStoreError(f'{store_setting(alias)}["BACKEND"] is missing')
    try:
        backend = import_string(path)
    except ImportError as exc:
        raise InvalidCheckpointStoreError(
            f'{store_setting(alias)}["BACKEND"] = {path!r} cannot be imported: {exc}'
        ) from exc
    if not (isinstance(backend, type) and issubclass(backend, CheckpointStore)):
        raise InvalidCheckpointStoreError(
            f'{store_setting(alias)}["BACKEND"] = {path!r} is not a CheckpointStore subclass'
        )
    return backend


def store_options(alias: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``OPTIONS`` dict of one alias (empty when absent)."""
    options = config.get("OPTIONS") or {}
    if not isinstance(options, Mapping):
        raise InvalidCheckpointStoreError(f'{store_setting(alias)}["OPTIONS"] must be a dict')
    return dict(options)


def create_store(alias: str, config: Mapping[str, Any]) -> CheckpointStore:
    """Build the store one alias describes."""
    backend = load_backend_class(alias, config)
    options = store_options(alias, config)
    try:
        return backend(**options)
    except TypeError as exc:
        raise InvalidCheckpointStoreError(
            f'{store_setting(alias)}["OPTIONS"] does not fit {backend.__name__}: {exc}'
        ) from exc


class CheckpointStoreHandler:
    """Process-wide registry of configured checkpoint stores, one instance per alias."""

    def __init__(self) -> None:
        self._stores: dict[str, CheckpointStore] = {}
        self._lock = threading.Lock()

    @property
    def settings(self) -> Mapping[str, Any]:
        return fw_settings.CHECKPOINT_STORES

    def __getitem__(self, alias: str) -> CheckpointStore:
        store = self._stores.get(alias)
        if store is not None:
            return store
        with self._lock:
            if alias not in self._stores:
                configured = self.settings
                if alias not in configured:
                    raise InvalidCheckpointStoreError(
                        f"No checkpoint store {alias!r} in {SETTING}; "
                        f"configured aliases: {', '.join(sorted(configured)) or 'none'}"
                    )
                self._stores[alias] = create_store(alias, configured[alias])
            return self._stores[alias]

    def __iter__(self) -> Iterator[str]:
        return iter(self.settings)

    def all(self, initialized_only: bool = False) -> list[CheckpointStore]:
        """Every configured store (only those already built with *initialized_only*)."""
        if initialized_only:
            return list(self._stores.values())
        return [self[alias] for alias in self]

    def reset(self) -> None:
        """Close and forget every built store; the next access rebuilds from settings."""
        with self._lock:
            stores, self._stores = self._stores, {}
        for store in stores.values():
            store.close()


checkpoint_stores = CheckpointStoreHandler()
