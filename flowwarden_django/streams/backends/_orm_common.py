"""What the ORM checkpoint store, dead-letter store and lock service share: the
Django database they work on."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, ClassVar

from django.db import connections, models, router


class OnDatabase:
    """A store on one Django database: ``using`` pins its alias, else the router's
    ``db_for_write`` of the store's model chooses, for reads too (a lagging replica
    could show a state that has moved on)."""

    #: The model of the store's table: what the router is asked about.
    _model: ClassVar[type[models.Model]]
    #: The database vendors the store's SQL supports (see :meth:`_connection`).
    _vendors: ClassVar[Collection[str]] = ()

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    def _alias(self) -> str:
        return self.using or router.db_for_write(self._model)

    def _connection(self) -> Any:
        """The connection of :meth:`_alias`, refused unless its vendor is supported."""
        connection = connections[self._alias()]
        if connection.vendor not in self._vendors:
            raise NotImplementedError(f"{type(self).__name__} does not support {connection.vendor}")
        return connection
