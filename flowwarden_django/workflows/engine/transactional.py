"""Transactional steps (``@step(transactional=True)``): a step whose database writes
commit in one transaction with its snapshot, as DBOS's transaction steps do.

Each attempt of such a step runs in a transaction of its own on the runs' database
(a savepoint when ``run_local`` is called inside one): the step function, then the
fenced save of its outcome (the snapshot at its ``seq`` and the run record moved to
it, only while this runner holds the run). When the save is refused (the run was
taken over: ``ConcurrentRunError``, ``LeaseLostError``, ``SnapshotConflictError``) or
fails, when the step raises, or when it returns ``fail``, the step's writes are rolled
back with it: a runner cut off mid-step whose late commit the fence refuses leaves no
effect behind, and a step's effects are committed once.

The constraints: the snapshot store is the ORM store (``OrmSnapshotStore``) on the
same database as the runs (``ImproperlyConfigured`` when the step runs otherwise, and
``manage.py check`` says so: E212);
the step writes through that database alias (other databases and outside services
are not in the transaction); it takes no ``timeout`` (the transaction lives on the
runner's thread, which a timeout would give up on). The claim keeper renews the lease
from its own thread and connection meanwhile, so a long step keeps its claim; its row
locks are held until the step's snapshot commits (on SQLite, the database's write
lock: every other writer waits, the keeper too).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

from ..definition.steps import Fail, StepOutcome, WorkflowStep
from ..runs.transactions import write_transaction

if TYPE_CHECKING:
    from .saving import RunWriter


class RolledBack(Exception):
    """The attempt's outcome is a ``Fail`` (returned, or a jump its step may not
    make): its writes were rolled back, and the run fails with *outcome*."""

    def __init__(self, outcome: Fail) -> None:
        super().__init__(outcome.reason)
        self.outcome = outcome


class SaveFailed(Exception):
    """The save of a transactional step's outcome failed (*error*: refused by the
    fence, say): the step's writes were rolled back with it."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def store_problem(store: Any, runs_db: str) -> str | None:
    """Why a transactional step cannot commit with its snapshots in *store*, its runs
    being on database *runs_db*; ``None`` when it can."""
    alias_of = getattr(store, "transaction_alias", None)
    if alias_of is None:
        return f"needs the ORM snapshot store (OrmSnapshotStore), not {type(store).__name__}"
    alias = alias_of()
    if alias != runs_db:
        return f"needs its snapshots and its runs on one database, not {alias!r} and {runs_db!r}"
    return None


def transaction_alias(writer: RunWriter, current: WorkflowStep) -> str:
    """The database of transactional step *current*'s transaction: the runs' one,
    which must be its ORM snapshot store's; ``ImproperlyConfigured`` otherwise."""
    problem = store_problem(writer.store, writer.runs.db)
    if problem is not None:
        raise ImproperlyConfigured(
            f"workflow {writer.name!r}: step {current.name!r} is transactional, which {problem}"
        )
    return writer.runs.db


@contextmanager
def attempt_transaction(writer: RunWriter, current: WorkflowStep) -> Iterator[None]:
    """The transaction of one attempt of *current* (nothing when it is not
    transactional). When it rolls back, *writer* forgets what the save did to it."""
    if not current.transactional:
        yield
        return
    alias = transaction_alias(writer, current)
    before = (writer.released, dict(writer.unsynced), writer.young_until, writer.handed)
    try:
        with write_transaction(alias):
            yield
    except BaseException:
        # Rolled back: the run is this execution's as it was before the save.
        writer.released, writer.unsynced, writer.young_until, writer.handed = before
        raise


def commit_with(commit: Callable[[StepOutcome], Any], outcome: StepOutcome) -> None:
    """Save *outcome* with *commit*, in the attempt's transaction: ``RolledBack`` as
    it is, any other error as ``SaveFailed`` (not a failure of the step's attempt)."""
    try:
        commit(outcome)
    except RolledBack:
        raise
    except Exception as exc:
        raise SaveFailed(exc) from exc
