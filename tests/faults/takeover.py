"""The partition of the Celery and Temporal runner tests: cut, watch the run be taken
over and completed on the host, heal once the partition has lasted its length."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from tests.faults.netns import NetworkNamespace


@dataclass(frozen=True)
class Takeover:
    """``time.monotonic()`` stamps of one partition."""

    cut_at: float
    taken_over_at: float
    done_at: float
    healed_at: float


def partition_during_takeover(
    namespace: NetworkNamespace,
    read: Callable[[], tuple[str, bool]],
    *,
    partition: float,
    bound: float,
    every: float = 0.05,
) -> Takeover:
    """Cut *namespace*'s link, then poll ``read()`` (the run's runner, and whether it
    has completed) until the run has completed and the link has healed, which it does
    *partition* seconds after the cut. The run must complete within *bound* seconds of
    the cut (``AssertionError``); it is taken over when its runner first differs from
    the one at the cut (or, not seen, when it completed)."""
    original, _ = read()
    cut_at = namespace.cut()
    taken_over_at = done_at = healed_at = None
    while done_at is None or healed_at is None:
        if healed_at is None and time.monotonic() >= cut_at + partition:
            healed_at = namespace.heal()
        runner, completed = read()
        now = time.monotonic()
        if taken_over_at is None and runner not in ("", original):
            taken_over_at = now
        if done_at is None and completed:
            done_at = now
        assert done_at is not None or now < cut_at + bound, (
            f"the run was not completed within {bound:.0f} s of the cut"
        )
        time.sleep(every)
    return Takeover(cut_at, taken_over_at or done_at, done_at, healed_at)
