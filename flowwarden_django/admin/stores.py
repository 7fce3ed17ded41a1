"""Which configured store an admin page shows: shared by the checkpoint and
dead-letter pages, which can only list rows of an ORM store."""

from __future__ import annotations

from typing import Any

from ..common.backend_aliases import BackendAliases


def sort_store_aliases(
    registry: BackendAliases[Any], orm_class: type, routed: str
) -> tuple[str | None, str | None, list[tuple[str, str]]]:
    """``(shown alias, its OPTIONS["using"], hidden)`` for one kind of store.

    The page shows the ORM alias ``"default"`` (else the first ORM alias);
    ``hidden`` lists ``(alias, what it is)`` for other backends and for ORM aliases
    on another database than the shown one (*routed* stands for an unset
    ``using``). Aliases whose backend cannot be loaded are skipped; the system
    checks report them.
    """
    orm: dict[str, str | None] = {}
    hidden: list[tuple[str, str]] = []
    for alias, config in registry.settings.items():
        try:
            backend = registry.load_backend_class(alias, config)
            using = registry.options(alias, config).get("using")
        except Exception:  # a broken alias must not break the page
            continue
        if issubclass(backend, orm_class):
            orm[alias] = using
        else:
            hidden.append((alias, backend.__name__))
    if not orm:
        return None, None, hidden
    shown = "default" if "default" in orm else next(iter(orm))
    using = orm[shown]
    hidden += [
        (alias, f"{orm_class.__name__} on database {db or routed!r}")
        for alias, db in orm.items()
        if (db or routed) != (using or routed)
    ]
    return shown, using, hidden
