"""Handing a run from one step to the next without letting go of it.

An execution provider that runs one step per task (Temporal) pays two statements a
step: the claim of the run (with the read of its head) and the step's save, which
releases it. Handed off, the save holds the run for the next step instead: it moves
the claim to a fresh token (``HANDOFF_PREFIX``) with a renewed lease, and the
provider carries that token and the new head, as the store wrote it (encrypted when
the store encrypts), to the next step. That step runs from them without claiming:
one statement per plain step, as a chain of tasks that each insert one row.

What keeps it safe is what keeps any step safe:

* the next step's save is conditional on the token, as every save is on its runner,
  so a run taken over meanwhile (a cancel, an upgrade, a lease that ran out) refuses
  it (``LeaseLostError``) and the step's result is discarded;
* its snapshot goes at the head's ``seq`` + 1, so a snapshot written meanwhile (a
  fork, a cancel) refuses it too (``SnapshotConflictError``);
* a step runs from what it was handed only while the hand-off is young (a third of
  the lease, on the wall clock, as leases are), the rule a plain step already follows
  to skip the run record: a lease that young cannot have been taken over;
* the carried head is signed with the project's ``SECRET_KEY``: a worker that can
  complete the provider's tasks but not write the database cannot forge a state.

Anything else (a retry, an input, another version, a head too large to carry, a
hand-off gone stale) claims the run as before, taking it from the token.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from typing import Any

from django.utils.crypto import constant_time_compare, salted_hmac

#: The largest head (stored state and metadata, in characters) a hand-off carries;
#: a larger one is read by the next step's claim instead.
CARRY_LIMIT = 16 * 1024
_SALT = "flowwarden_django.workflows.handoff"


@dataclasses.dataclass(frozen=True)
class Handoff:
    """Run *coordination_id* held between two steps: the *token* it is held under,
    since *at* (wall clock, ``time.time()``), at *version*; and, when carried, its
    *head* as the store wrote it (``carry``), with the run-record fields a step reads
    that a plain step does not change."""

    coordination_id: str
    token: str
    version: int
    at: float
    head: Mapping[str, Any] | None = None
    parent_coordination_id: str | None = None
    attempts: int = 0
    #: The run's queue, partition and priority (``WorkflowRun.queue``...), as started.
    queue: str = ""
    queue_partition: str = ""
    queue_priority: int = 0

    def age(self) -> float:
        """Seconds since the run was handed off."""
        return time.time() - self.at

    def without_head(self) -> Handoff:
        """The same hand-off, its head to be read by a claim."""
        return dataclasses.replace(self, head=None)

    def as_dict(self) -> dict[str, Any]:
        """The hand-off as plain JSON data, signed, for a provider's messages."""
        # Not dataclasses.asdict: it deep-copies the carried head, on every step.
        data = {name: getattr(self, name) for name in _FIELDS}
        if self.head is not None:
            data["head"] = dict(self.head)
        data["signature"] = _sign(data)
        return data

    @classmethod
    def from_dict(cls, data: Any, coordination_id: str) -> Handoff | None:
        """The hand-off of run *coordination_id* that ``as_dict`` made, or ``None``
        (not one, or another run's); a head whose signature does not match is dropped
        (the next step then reads it with its claim)."""
        if not isinstance(data, Mapping) or data.get("coordination_id") != coordination_id:
            return None
        fields = {name: data.get(name) for name in _FIELDS}
        try:
            handoff = cls(**{k: v for k, v in fields.items() if v is not None})
        except TypeError:
            return None
        if not isinstance(handoff.token, str) or not isinstance(handoff.at, (int, float)):
            return None
        signature = data.get("signature")
        if handoff.head is not None and not (
            isinstance(signature, str) and constant_time_compare(signature, _sign(fields))
        ):
            return handoff.without_head()
        return handoff


def taken_from(handed: Handoff | None, hands_to: str, *, copy: bool) -> tuple[str, ...]:
    """The hand-off tokens a step's claim may take the run from (``ClaimTerms.held_by``):
    *hands_to*, the token the step hands the run on to (an earlier copy of it may have
    saved and died), and the token it was *handed*, unless the step is a *copy* (a
    retry, a redelivery): the copy before it may still run from that one, so a copy
    waits for the hold to end, as it waits for any live claim."""
    if handed is None or copy:
        return (hands_to,)
    return (handed.token, hands_to)


#: The fields of a ``Handoff``, in the order they are signed.
_FIELDS = tuple(field.name for field in dataclasses.fields(Handoff))


def _sign(fields: Mapping[str, Any]) -> str:
    message = json.dumps([fields.get(name) for name in _FIELDS], sort_keys=True, default=str)
    return salted_hmac(_SALT, message, algorithm="sha256").hexdigest()
