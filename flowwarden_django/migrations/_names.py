"""A model's options in the migrations (not a migration: the loader skips modules whose
names start with ``_``)."""

from typing import Any


def named(name: str, **options: Any) -> dict[str, Any]:
    """*options* with the model's ``verbose_name`` and its plural: the name and an "s",
    as every model of the app spells it."""
    return {"verbose_name": name, "verbose_name_plural": f"{name}s", **options}
