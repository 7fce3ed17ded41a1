"""The rows that hold a queue's capacity (``WorkflowQueueSlot``), per partition.

A queue with ``concurrency`` N has N ``concurrency`` slots; one with ``rate`` N/P has N
``rate`` slots. Every slot is taken by one conditional ``UPDATE`` on the token it was
read with and on being free (``held_until`` unset or past, on the database's clock),
so of two takers one wins, and a slot a dead holder kept is free once its lease ends:

* a concurrency slot is held under a token beginning ``run:`` while a step runs (its
  runner's claim keeper renews the lease), or ``next:`` once ``dispatch`` has given
  it to a waiting run that has yet to start;
* a rate slot is spent by a step start (``used:``) or paid for a dispatched run
  (``paid:``), and is free again one period after: so no window of one period holds
  more starts than there are rate slots.

The rows are made on first use (``ensure``); a limit lowered later leaves the
numbers past it unused.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from django.db.models import DateTimeField, ExpressionWrapper, Q, Value
from django.db.models.functions import Coalesce, Greatest, Now
from django.utils import timezone

from ...common.app_models import models

RUNNING = "run:"
DISPATCHED = "next:"
USED = "used:"
PAID = "paid:"
CONCURRENCY = "concurrency"
RATE = "rate"

#: (database, queue, partition, kind, limit) whose rows exist: not checked again.
_made: set[tuple[str, str, str, str, int]] = set()


@dataclasses.dataclass
class SlotRow:
    """A slot as read: its primary key, number, holder, token and lease end."""

    pk: int
    kind: str
    number: int
    holder: str
    token: str
    held_until: datetime | None

    def free_at(self, now: datetime) -> bool:
        return self.held_until is None or self.held_until <= now

    def held_by(self, holder: str, prefix: str, now: datetime) -> bool:
        return self.holder == holder and self.token.startswith(prefix) and not self.free_at(now)


def new_token(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def _slots(using: str) -> models.QuerySet:
    return models.WorkflowQueueSlot.objects.using(using)


def ensure(using: str, queue: str, partition: str, kind: str, limit: int) -> None:
    """Make the *limit* slots of *kind* of the queue's partition (once per process)."""
    key = (using, queue, partition, kind, limit)
    if key in _made:
        return
    rows = [
        models.WorkflowQueueSlot(queue=queue, partition=partition, kind=kind, number=n)
        for n in range(limit)
    ]
    _slots(using).bulk_create(rows, ignore_conflicts=True)
    _made.add(key)


def forget_made() -> None:
    """Forget which rows were made (tests that flush the table)."""
    _made.clear()


def read(
    using: str, queue: str, partition: str, limits: dict[str, int], waiting: Q | None = None
) -> tuple[list[SlotRow], bool]:
    """The slots of the queue's partition within *limits* (kind: count), and whether a
    run matching *waiting* waits in it (``None``: not asked): one ``SELECT``."""
    from django.db.models import Exists

    wanted = Q()
    for kind, limit in limits.items():
        wanted |= Q(kind=kind, number__lt=limit)
    rows = _slots(using).filter(wanted, queue=queue, partition=partition)
    fields = ["pk", "kind", "number", "holder", "token", "held_until"]
    if waiting is not None:
        runs = models.WorkflowRun.objects.using(using).filter(waiting)
        rows = rows.annotate(waits=Exists(runs))
        fields.append("waits")
    found = list(rows.values_list(*fields))
    waits = bool(found and waiting is not None and found[0][-1])
    if waiting is not None and not found:
        waits = models.WorkflowRun.objects.using(using).filter(waiting).exists()
    return [SlotRow(*row[:6]) for row in found], waits


def lease_end(seconds: float) -> ExpressionWrapper:
    return ExpressionWrapper(
        Now() + Value(timedelta(seconds=seconds)), output_field=DateTimeField()
    )


def take(
    using: str,
    rows: Iterable[SlotRow],
    holder: str,
    prefix: str,
    hold_for: float,
    *,
    tries: int = 3,
) -> SlotRow | None:
    """Take one free slot of *rows* for *holder* under a new *prefix* token, held
    *hold_for* seconds: the slot (its new token), or ``None`` when none was free.
    Tries the ones that look free (the database's clock decides), soonest free first."""
    now = timezone.now()
    # A small allowance for the two clocks: the statement's condition is the judge.
    soon = now + timedelta(seconds=0.5)
    candidates = sorted(
        (row for row in rows if row.held_until is None or row.held_until <= soon),
        key=lambda row: (row.held_until is not None, row.held_until or now, row.number),
    )
    for row in candidates[:tries]:
        taken = claim(using, row, holder, prefix, hold_for, must_be_free=True)
        if taken is not None:
            return taken
    return None


def claim(
    using: str,
    row: SlotRow,
    holder: str,
    prefix: str,
    hold_for: float,
    *,
    must_be_free: bool,
    no_sooner: bool = False,
) -> SlotRow | None:
    """Set *row* to *holder* under a new *prefix* token, held *hold_for* seconds (or
    until it was held, if later, when *no_sooner*), if its token is still the one read
    (and it is free, when *must_be_free*)."""
    token = new_token(prefix)
    rows = _slots(using).filter(pk=row.pk, token=row.token)
    if must_be_free:
        rows = rows.filter(Q(held_until__isnull=True) | Q(held_until__lte=Now()))
    until = lease_end(hold_for)
    if no_sooner:
        until = Greatest(Coalesce("held_until", until), until)
    if rows.update(holder=holder, token=token, held_until=until) != 1:
        return None
    return dataclasses.replace(row, holder=holder, token=token, held_until=None)


def respend(using: str, row: SlotRow, prefix: str) -> SlotRow | None:
    """Re-token *row* (keeping its lease end): a paid rate slot spent by its run."""
    token = new_token(prefix)
    if _slots(using).filter(pk=row.pk, token=row.token).update(token=token) != 1:
        return None
    return dataclasses.replace(row, token=token)


def release(using: str, row: SlotRow) -> bool:
    """Free *row* if it still holds the token it was taken with."""
    return bool(
        _slots(using)
        .filter(pk=row.pk, token=row.token)
        .update(holder="", token="", held_until=None)
    )


def release_dispatched(using: str, queue: str, partition: str, holder: str) -> int:
    """Free the slots ``dispatch`` gave *holder* (``next:``, ``paid:``) that it has not
    taken up: it waits again. How many."""
    given = Q(kind=CONCURRENCY, token__startswith=DISPATCHED) | Q(kind=RATE, token__startswith=PAID)
    rows = _slots(using).filter(given, queue=queue, partition=partition, holder=holder)
    return rows.update(holder="", token="", held_until=None)


def renew(using: str, row: SlotRow, hold_for: float) -> bool:
    """Extend the lease of *row*, held under its token; False when it was lost."""
    rows = _slots(using).filter(pk=row.pk, token=row.token)
    return rows.update(held_until=lease_end(hold_for)) == 1


def next_free(rows: Sequence[SlotRow], now: datetime | None = None) -> datetime | None:
    """When the first of *rows* that is held becomes free (``None``: one is free, or
    none is held on a lease)."""
    now = now or timezone.now()
    ends = [row.held_until for row in rows]
    if any(end is None or end <= now for end in ends):
        return None
    return min(end for end in ends if end is not None)
