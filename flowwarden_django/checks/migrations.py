"""The check of the squashed migrations: E016 a database recorded some, not all, of the
migrations a squashed migration replaces (the old chain, half applied, whose files
this release no longer has)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.core import checks

APP_LABEL = "flowwarden_django"


@checks.register(checks.Tags.database)
def check_squashed_migrations(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E016 for each database that recorded some but not all of the migrations one of
    the app's squashed migrations replaces: Django can use neither the squashed one
    nor the old ones (gone), and ``migrate`` would stop on a confusing conflict. Reads
    ``django_migrations`` of each database the app migrates on (skipped where it
    cannot be read, and, when the caller names the databases checks may read, on the
    others)."""
    from django.db import DatabaseError, connections, router
    from django.db.migrations.recorder import MigrationRecorder

    databases = kwargs.get("databases")
    squashed = squashed_migrations()
    if not squashed:
        return []
    messages: list[checks.CheckMessage] = []
    for alias in connections:
        if databases is not None and alias not in databases:
            continue
        if not router.allow_migrate(alias, APP_LABEL):
            continue
        try:
            applied = {
                name
                for app, name in MigrationRecorder(connections[alias]).applied_migrations()
                if app == APP_LABEL
            }
        except DatabaseError:
            continue
        messages.extend(partly_applied(alias, applied, squashed))
    return messages


def squashed_migrations() -> dict[str, list[str]]:
    """The app's squashed migrations on disk: name -> the names it replaces, in order."""
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(None, load=False)
    loader.load_disk()
    return {
        name: [replaced for app, replaced in migration.replaces if app == APP_LABEL]
        for (app, name), migration in sorted(loader.disk_migrations.items())
        if app == APP_LABEL and migration.replaces
    }


def partly_applied(
    alias: str, applied: Iterable[str], squashed: dict[str, Sequence[str]]
) -> list[checks.CheckMessage]:
    """E016 for each squashed migration of which *applied* holds some replaced names
    but not all."""
    applied = set(applied)
    messages: list[checks.CheckMessage] = []
    for name, replaces in squashed.items():
        done = [replaced for replaced in replaces if replaced in applied]
        if not done or len(done) == len(replaces):
            continue
        missing = [replaced for replaced in replaces if replaced not in applied]
        last = replaces[-1]
        messages.append(
            checks.Error(
                f"Database {alias!r} applied {len(done)} of the {len(replaces)} migrations "
                f"that {APP_LABEL}.{name} replaces (not {', '.join(missing)}): this "
                "release squashed them and no longer has their files, so it can neither "
                "apply the squashed migration nor finish the old ones.",
                hint="Finish the old migrations with the previous release (or the "
                "checkout) that still has them: with it installed, run `manage.py migrate "
                f"{APP_LABEL} {last} --database {alias}`; then install this release and "
                "run `manage.py migrate`, which takes the squashed migration as applied.",
                obj=alias,
                id="flowwarden_django.E016",
            )
        )
    return messages
