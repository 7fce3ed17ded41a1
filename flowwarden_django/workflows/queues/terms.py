"""The terms the gate and ``dispatch`` share: which runs wait in a queue's partition,
and how long a rate slot stays spent."""

from __future__ import annotations

from django.db.models import Q

from ..runs.status import RunStatus
from .settings import QueueConfig

#: Rate slots are held this share of their period longer (at most 50 ms): the time
#: between a step's admission and its first line, so that starts, not only
#: admissions, keep to the rate.
RATE_GUARD = 0.05


def waiting_in(config: QueueConfig, partition: str) -> Q:
    """The runs waiting for a slot of *config*'s queue in *partition*."""
    return Q(status=RunStatus.WAITING_SLOT, queue=config.name, queue_partition=partition)


def rate_hold(config: QueueConfig) -> float:
    """Seconds a rate slot of *config* stays spent after a start."""
    assert config.rate is not None
    return config.rate.period + min(0.05, config.rate.period * RATE_GUARD)
