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
import random
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, NamedTuple

from django.db import connections
from django.db.models import DateTimeField, ExpressionWrapper, F, Q, Value
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
    ahead: float = 0.0,
) -> SlotRow | None:
    """Take one free slot of *rows* for *holder* under a new *prefix* token, held
    *hold_for* seconds: the slot (its new token), or ``None`` when none was free.
    With *ahead* (seconds), a slot that frees within that time is taken too, held for
    *hold_for* from when it frees (``paid_from`` says when its use may begin).
    Tries the ones that look free (the database's clock decides), free ones first, in
    a random order: takers that read the same rows at once then seldom try the same
    slot (in number order, all but one would lose their first try, and with few
    tries park while slots are free)."""
    now = timezone.now()
    # A small allowance for the two clocks: the statement's condition is the judge.
    soon = now + timedelta(seconds=0.5)
    looks_free = [row for row in rows if row.held_until is None or row.held_until <= soon]
    random.shuffle(looks_free)
    candidates = sorted(looks_free, key=lambda row: not row.free_at(now))
    hold = Hold(holder, prefix, hold_for, ahead)
    for row in candidates[:tries]:
        taken = claim(using, row, hold, must_be_free=True)
        if taken is not None:
            return taken
    return None


class Hold(NamedTuple):
    """How ``claim`` holds a slot: for *holder*, under a new *prefix* token, for
    *hold_for* seconds; *ahead* (seconds): a slot that frees within that time is free
    enough, held for *hold_for* from when it frees."""

    holder: str
    prefix: str
    hold_for: float
    ahead: float = 0.0


def claim(
    using: str, row: SlotRow, hold: Hold, *, must_be_free: bool, no_sooner: bool = False
) -> SlotRow | None:
    """Set *row* to *hold*'s holder under a new token, held *hold_for* seconds (or
    until it was held, if later, when *no_sooner*), if its token is still the one read
    (and it is free, when *must_be_free*: free within the hold's *ahead* seconds, then
    held for *hold_for* from when it frees)."""
    holder, prefix, hold_for, ahead = hold
    token = new_token(prefix)
    rows = _slots(using).filter(pk=row.pk, token=row.token)
    if must_be_free:
        rows = rows.filter(Q(held_until__isnull=True) | Q(held_until__lte=lease_end(ahead)))
    until = lease_end(hold_for)
    if no_sooner:
        until = Greatest(Coalesce("held_until", until), until)
    elif ahead:
        hold = Value(timedelta(seconds=hold_for))
        until = ExpressionWrapper(
            Greatest(Coalesce("held_until", Now()), Now()) + hold, output_field=DateTimeField()
        )
    if rows.update(holder=holder, token=token, held_until=until) != 1:
        return None
    return dataclasses.replace(row, holder=holder, token=token, held_until=None)


def paid_from(row: SlotRow, hold_for: float) -> datetime | None:
    """When the use of a slot paid ahead (held *hold_for* from when it freed) may
    begin: ``None`` when read without its lease end."""
    if row.held_until is None:
        return None
    return row.held_until - timedelta(seconds=hold_for)


def respend(using: str, row: SlotRow, prefix: str) -> SlotRow | None:
    """Re-token *row* (keeping its lease end): a paid rate slot spent by its run."""
    token = new_token(prefix)
    if _slots(using).filter(pk=row.pk, token=row.token).update(token=token) != 1:
        return None
    return dataclasses.replace(row, token=token)


def take_first(
    using: str,
    queue: str,
    partition: str,
    limit: int,
    holder: str,
    hold_for: float,
    *,
    adopt_kept: bool = True,
) -> SlotRow | None:
    """PostgreSQL: take a concurrency slot of the queue's partition for *holder* in ONE
    statement: the slot ``dispatch`` gave *holder* (``next:``); else, unless another
    run waits for one, the one *holder*'s previous step kept for it (``run:``) or the
    first free one no other taker has locked (``SKIP LOCKED``: takers at once take
    different slots). ``None`` when it took none (a full queue, runs waiting, another
    database): the caller reads the slots and decides. Not *adopt_kept*: another
    execution of *holder* holds its ``run:`` slot now, which is not taken from it.

    The row is locked and checked again on its newest version before it is set (a
    slot taken meanwhile is skipped), so it is never held twice."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    token = new_token(RUNNING)
    with connection.cursor() as cursor:
        params = _take_first_params(queue, partition, limit, holder, token, hold_for)
        if not adopt_kept:
            params[7] = ""  # none of its rows: a free one
        cursor.execute(_take_first_sql(), params)
        found = cursor.fetchone()
    if found is None:
        return None
    return SlotRow(found[0], CONCURRENCY, found[1], holder, token, None)


def _take_first_params(
    queue: str, partition: str, limit: int, holder: str, token: str, hold_for: float
) -> list[Any]:
    from ..runs.status import RunStatus

    return [
        holder,
        token,
        hold_for,
        queue,
        partition,
        CONCURRENCY,
        limit,
        holder,
        holder,
        holder,
        f"{DISPATCHED}%",
        RunStatus.WAITING_SLOT,
        queue,
        partition,
        holder,
    ]


@lru_cache(maxsize=1)
def _take_first_sql() -> str:
    slot = models.WorkflowQueueSlot._meta.db_table
    run = models.WorkflowRun._meta.db_table
    free = "(held_until IS NULL OR held_until <= STATEMENT_TIMESTAMP())"
    return (
        f'UPDATE "{slot}" SET holder = %s, token = %s, '
        "held_until = STATEMENT_TIMESTAMP() + make_interval(secs => %s) "
        f'WHERE id = (SELECT id FROM "{slot}" WHERE queue = %s AND partition = %s '
        f"AND kind = %s AND number < %s AND ({free} OR holder = %s) "
        "ORDER BY (holder = %s) DESC, number LIMIT 1 FOR UPDATE SKIP LOCKED) "
        f'AND ((holder = %s AND token LIKE %s) OR NOT EXISTS (SELECT 1 FROM "{run}" '
        "WHERE status = %s "
        "AND queue = %s AND queue_partition = %s AND coordination_id <> %s)) "
        "RETURNING id, number"
    )


def others_wait(using: str, queue: str, partition: str, holder: str) -> bool:
    """Whether a run other than *holder* waits for a slot of the queue's partition: one
    small query, written out (it runs between every two steps of a queued run, where
    building it with the ORM cost more than running it)."""
    from ..runs.status import RunStatus

    connection = connections[using]
    with connection.cursor() as cursor:
        cursor.execute(
            _others_wait_sql(connection.vendor), [RunStatus.WAITING_SLOT, queue, partition, holder]
        )
        return cursor.fetchone() is not None


@lru_cache(maxsize=4)
def _others_wait_sql(vendor: str) -> str:
    mark = "`" if vendor == "mysql" else '"'

    def quote(name: str) -> str:
        return f"{mark}{name}{mark}"

    run = models.WorkflowRun._meta
    column = {field.name: quote(field.column) for field in run.concrete_fields}
    return (
        f"SELECT 1 FROM {quote(run.db_table)} WHERE {column['status']} = %s "
        f"AND {column['queue']} = %s AND {column['queue_partition']} = %s "
        f"AND {column['coordination_id']} <> %s LIMIT 1"
    )


def release(using: str, row: SlotRow) -> bool:
    """Free *row* if it still holds the token it was taken with. Outside a transaction
    on PostgreSQL the commit does not wait for the WAL flush (``synchronous_commit``
    off for this statement's own transaction): a release a server crash forgets
    leaves the slot held until its lease ends, and a later commit flushes it first."""
    connection = connections[using]
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        with connection.cursor() as cursor:
            cursor.execute(_release_sql(), [row.pk, row.token])
            return cursor.rowcount == 1
    rows = _slots(using).filter(pk=row.pk, token=row.token)
    return bool(rows.update(holder="", token="", held_until=None))


@lru_cache(maxsize=1)
def _release_sql() -> str:
    slot = models.WorkflowQueueSlot._meta.db_table
    return (
        f"UPDATE \"{slot}\" SET holder = '', token = '', held_until = NULL "
        "WHERE id = %s AND token = %s "
        "AND set_config('synchronous_commit', 'off', true) IS NOT NULL"
    )


def release_dispatched(
    using: str, queue: str, partition: str, holder: str, paid_hold: float | None = None
) -> int:
    """Free the slots ``dispatch`` gave *holder* (``next:``, ``paid:``) that it has not
    taken up: it waits again. How many. A paid rate slot (held *paid_hold* from when
    it freed) goes back to when it freed, not to free now: its last use may still be
    inside its period."""
    mine = _slots(using).filter(queue=queue, partition=partition, holder=holder)
    given = mine.filter(kind=CONCURRENCY, token__startswith=DISPATCHED)
    count = given.update(holder="", token="", held_until=None)
    if paid_hold is not None:
        paid = mine.filter(kind=RATE, token__startswith=PAID)
        count += paid.update(holder="", token="", held_until=_freed(paid_hold))
    return count


def release_paid(using: str, row: SlotRow, paid_hold: float) -> bool:
    """Give back a rate slot paid for a run that will not use it: free again when it
    freed before it was paid (see ``release_dispatched``)."""
    rows = _slots(using).filter(pk=row.pk, token=row.token)
    return rows.update(holder="", token="", held_until=_freed(paid_hold)) == 1


def _freed(paid_hold: float) -> ExpressionWrapper:
    hold = Value(timedelta(seconds=paid_hold))
    return ExpressionWrapper(F("held_until") - hold, output_field=DateTimeField())


def renew(using: str, row: SlotRow, hold_for: float) -> bool:
    """Extend the lease of *row*, held under its token; False when it was lost."""
    rows = _slots(using).filter(pk=row.pk, token=row.token)
    return rows.update(held_until=lease_end(hold_for)) == 1


def hold_from_now(using: str, row: SlotRow, hold_for: float) -> bool:
    """Hold *row*, held under its token, until *hold_for* seconds from now if that is
    later than its lease end; False when it was lost."""
    rows = _slots(using).filter(pk=row.pk, token=row.token)
    until = lease_end(hold_for)
    return rows.update(held_until=Greatest(Coalesce("held_until", until), until)) == 1


def next_free(rows: Sequence[SlotRow], now: datetime | None = None) -> datetime | None:
    """When the first of *rows* that is held becomes free (``None``: one is free, or
    none is held on a lease)."""
    now = now or timezone.now()
    ends = [row.held_until for row in rows]
    if not ends or any(end is None or end <= now for end in ends):
        return None  # one is free (or none was read: the caller tries again)
    return min(end for end in ends if end is not None)
