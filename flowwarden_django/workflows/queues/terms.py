"""The terms the gate and ``dispatch`` share: which runs wait in a queue's partition,
and how long a rate slot stays spent."""

from __future__ import annotations

from django.db.models import Q

from ..runs.status import RunStatus
from .settings import QueueConfig

#: A rate slot is spent from a step's admission for its period and this share of it
#: more (at most 20 ms): the time between the admission and the step's first line,
#: so that starts, not only admissions, keep to the rate.
RATE_GUARD = 0.05
#: A rate slot ``dispatch`` pays for a waiting run is held from the payment for this
#: share more (at most 50 ms): the run is admitted in that time, usually, and its
#: admission then leaves the slot's end as it is instead of moving it later (which
#: would slow the rate by the time the run took to start).
PAID_GUARD = 0.05
#: Seconds before a rate slot frees that ``dispatch`` may pay it for a waiting run:
#: the run starts its step at once if it is ready by then, or pauses in its admission
#: until the slot frees (at most this long). So the time a woken run takes to get
#: going overlaps the slot's last moments, instead of slowing the rate by it.
PAY_AHEAD = 0.3


def waiting_in(config: QueueConfig, partition: str) -> Q:
    """The runs waiting for a slot of *config*'s queue in *partition*."""
    return Q(status=RunStatus.WAITING_SLOT, queue=config.name, queue_partition=partition)


def rate_guard(config: QueueConfig) -> float:
    """Seconds a rate slot of *config* stays spent beyond its period: the time a
    step may take from its admission to its first line (``StepGate.step_begins``)."""
    assert config.rate is not None
    return min(0.05, config.rate.period * RATE_GUARD)


def rate_hold(config: QueueConfig) -> float:
    """Seconds a rate slot of *config* stays spent after a step's admission."""
    assert config.rate is not None
    return config.rate.period + rate_guard(config)


def paid_hold(config: QueueConfig) -> float:
    """Seconds a rate slot of *config* that dispatch paid stays spent from then."""
    assert config.rate is not None
    return config.rate.period + min(0.05, config.rate.period * PAID_GUARD)
