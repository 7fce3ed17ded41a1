"""Backends by alias, configured like ``CACHES``: the registry class behind
``checkpoint_stores``, ``dlq_stores``, ``lock_services`` and ``snapshot_stores``."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

from django.utils.module_loading import import_string

from ..conf import SETTING_NAME, fw_settings
from ..exceptions import InvalidCheckpointStoreError

B = TypeVar("B")


@dataclasses.dataclass(eq=False, repr=False)
class BackendAliases(Generic[B]):
    """Process-wide registry of one kind of configured backend, one instance per alias.

    ``key`` is the ``FLOWWARDEN`` key (``"CHECKPOINT_STORES"``), ``base`` the SPI
    class every ``BACKEND`` must subclass, ``kind`` how messages name it.
    """

    key: str
    base: type[B]
    kind: str
    error: type[Exception] = InvalidCheckpointStoreError
    _backends: dict[str, B] = dataclasses.field(default_factory=dict, init=False)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, init=False)

    @property
    def setting(self) -> str:
        """The setting path, as messages name it: ``FLOWWARDEN["DLQ_STORES"]``."""
        return f'{SETTING_NAME}["{self.key}"]'

    def alias_setting(self, alias: str) -> str:
        """The setting path of one alias."""
        return f'{self.setting}["{alias}"]'

    @property
    def settings(self) -> Mapping[str, Any]:
        return getattr(fw_settings, self.key)

    def load_backend_class(self, alias: str, config: Mapping[str, Any]) -> type[B]:
        """Import the ``BACKEND`` class of one alias, or raise a message naming the setting."""
        where = self.alias_setting(alias)
        if not isinstance(config, Mapping):
            raise self.error(f"{where} must be a dict with a BACKEND key")
        path = config.get("BACKEND")
        if not isinstance(path, str) or not path:
            raise self.error(f'{where}["BACKEND"] is missing')
        try:
            backend = import_string(path)
        except ImportError as exc:
            raise self.error(f'{where}["BACKEND"] = {path!r} cannot be imported: {exc}') from exc
        if not (isinstance(backend, type) and issubclass(backend, self.base)):
            raise self.error(
                f'{where}["BACKEND"] = {path!r} is not a {self.base.__name__} subclass'
            )
        return backend

    def options(self, alias: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """The ``OPTIONS`` dict of one alias (empty when absent)."""
        options = config.get("OPTIONS") or {}
        if not isinstance(options, Mapping):
            raise self.error(f'{self.alias_setting(alias)}["OPTIONS"] must be a dict')
        return dict(options)

    def create(self, alias: str, config: Mapping[str, Any]) -> B:
        """Build the backend one alias describes."""
        backend = self.load_backend_class(alias, config)
        options = self.options(alias, config)
        try:
            return backend(**options)
        except TypeError as exc:
            raise self.error(
                f'{self.alias_setting(alias)}["OPTIONS"] does not fit {backend.__name__}: {exc}'
            ) from exc

    def __getitem__(self, alias: str) -> B:
        backend = self._backends.get(alias)
        if backend is not None:
            return backend
        with self._lock:
            if alias not in self._backends:
                configured = self.settings
                if alias not in configured:
                    raise self.error(
                        f"No {self.kind} {alias!r} in {self.setting}; "
                        f"configured aliases: {', '.join(sorted(configured)) or 'none'}"
                    )
                self._backends[alias] = self.create(alias, configured[alias])
            return self._backends[alias]

    def __iter__(self) -> Iterator[str]:
        return iter(self.settings)

    def all(self, initialized_only: bool = False) -> list[B]:
        """Every configured backend (only those already built with *initialized_only*)."""
        if initialized_only:
            return list(self._backends.values())
        return [self[alias] for alias in self]

    def reset(self) -> None:
        """Close and forget every built backend; the next access rebuilds from settings."""
        with self._lock:
            backends, self._backends = self._backends, {}
        for backend in backends.values():
            close = getattr(backend, "close", None)
            if close is not None:
                close()
