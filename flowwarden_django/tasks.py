"""Celery tasks: thin wrappers of the dead-letter operations of ``streams/replay.py``.

Found by ``app.autodiscover_tasks()`` (or registered by
``flowwarden_django.celery.install(app)``). Each returns plain JSON-serializable
data, so any result backend can keep it. ``purge_dead_letters`` is meant for beat::

    CELERY_BEAT_SCHEDULE = {
        "flowwarden-purge-dead-letters": {
            "task": "flowwarden_django.purge_dead_letters",
            "schedule": 3600.0,
        },
    }

Importing this module also connects the ``CELERY_RUN_STREAMS`` hook (see
``flowwarden_django.celery``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from celery import shared_task

from . import celery as _celery_integration  # noqa: F401  (connects the settings hook)

# The tasks import ``streams.replay`` when they run: ``install(app)`` imports this module
# from the Celery app module, before Django is set up.


def _outcomes(outcomes: list[Any]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(outcome) for outcome in outcomes]


@shared_task(name="flowwarden_django.replay_dead_letters")
def replay_dead_letters(ids: list[str], store: str = "default", by: str = "") -> list[dict]:
    """Replay the dead letters *ids* of DLQ store *store*, in order; one outcome each."""
    from .streams import replay

    return _outcomes(replay.replay_dead_letters(ids, store=store, by=by))


@shared_task(name="flowwarden_django.replay_stream")
def replay_stream(
    stream: str, store: str = "default", by: str = "", limit: int | None = None
) -> list[dict]:
    """Replay the pending dead letters of *stream*, oldest first; one outcome each."""
    from .streams import replay

    return _outcomes(replay.replay_stream(stream, store=store, by=by, limit=limit))


@shared_task(name="flowwarden_django.purge_dead_letters")
def purge_dead_letters() -> dict[str, int]:
    """Delete the expired dead letters of every DLQ store; the count per store alias."""
    from .streams import replay

    return replay.purge_expired_dead_letters()
