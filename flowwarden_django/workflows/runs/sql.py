"""The PostgreSQL statements of the run records, as SQL text built once per shape from
``WorkflowRun``'s columns: the claim of a new or an existing run, the claim of a run
on terms, and the insert of a new run (claimed, or unclaimed at its head)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, NamedTuple

from ...common.app_models import models
from .status import RunStatus


@lru_cache(maxsize=1)
def run_fields() -> tuple[Any, ...]:
    """The fields of ``WorkflowRun``'s columns, in the model's order."""
    return tuple(models.WorkflowRun._meta.concrete_fields)


@lru_cache(maxsize=1)
def run_attnames() -> tuple[str, ...]:
    return tuple(field.attname for field in run_fields())


@lru_cache(maxsize=1)
def converted_fields() -> tuple[tuple[int, Any], ...]:
    """The fields whose database values need converting (``from_db_value``), by index."""
    fields = enumerate(run_fields())
    return tuple((index, field) for index, field in fields if hasattr(field, "from_db_value"))


#: What ``claim_or_create`` inserts: a SQL literal or a ``%s`` parameter per field.
_INSERTED = {
    "coordination_id": "%s",
    "workflow_name": "%s",
    "workflow_version": "%s",
    "status": f"'{RunStatus.RUNNING}'",
    "last_step": "''",
    "head_snapshot_id": "NULL",
    "idempotency_key": "NULL",
    "failure_reason": "''",
    "resume_input": "%s",
    "runner": "%s",
    "claimed_until": "STATEMENT_TIMESTAMP() + make_interval(secs => %s)",
    "attempts": "0",
    "wake_at": "NULL",
    "step_errors": "NULL",
    "parent_coordination_id": "NULL",
    "waiting_topic": "''",
    "queue": "''",
    "queue_partition": "''",
    "queue_priority": "0",
    "queued_at": "NULL",
    "created_at": "%s",
    "updated_at": "%s",
}


@lru_cache(maxsize=2)
def claim_or_create_sql(with_input: bool) -> str:
    """PostgreSQL: insert the run claimed, or claim the existing one when it is
    unclaimed and of the same workflow (``claim``'s conditions and retry count);
    returns the row either way, none when refused."""
    fields = run_fields()
    column = {field.name: f'"{field.column}"' for field in fields}
    assert set(_INSERTED) == set(column), "WorkflowRun's columns changed"
    runner, until, status = column["runner"], column["claimed_until"], column["status"]
    retry = f"CASE WHEN run.{status} = '{RunStatus.FAILED}' OR run.{runner} <> '' THEN 1 ELSE 0 END"
    taken = [
        f"{runner} = EXCLUDED.{runner}",
        f"{until} = EXCLUDED.{until}",
        f"{column['attempts']} = run.{column['attempts']} + {retry}",
        f"{column['updated_at']} = EXCLUDED.{column['updated_at']}",
    ]
    if with_input:
        taken.append(f"{column['resume_input']} = EXCLUDED.{column['resume_input']}")
    unclaimed = f"(run.{runner} = '' OR run.{until} IS NULL OR run.{until} < STATEMENT_TIMESTAMP())"
    return (
        f'INSERT INTO "{models.WorkflowRun._meta.db_table}" AS run '
        f"({', '.join(column[name] for name in _INSERTED)}) "
        f"VALUES ({', '.join(_INSERTED.values())}) "
        f"ON CONFLICT ({column['coordination_id']}) DO UPDATE SET {', '.join(taken)} "
        f"WHERE {unclaimed} AND run.{column['workflow_name']} = %s "
        f"AND run.{column['workflow_version']} = %s "
        # xmax = 0: a row version no transaction has locked or updated, one this
        # statement inserted (an ON CONFLICT update leaves its own xid there).
        f"RETURNING {', '.join(column[field.name] for field in fields)}, "
        '(run.xmax = 0) AS "created"'
    )


#: What ``create_statement`` inserts (unlisted columns as ``_INSERTED`` has them):
#: its queue fields too (``start(queue=...)``), so a queued start is one statement.
_CREATED = {
    **_INSERTED,
    "head_snapshot_id": "%s",
    "idempotency_key": "%s",
    "resume_input": "NULL",
    "runner": "''",
    "claimed_until": "NULL",
    "queue": "%s",
    "queue_partition": "%s",
    "queue_priority": "%s",
}
#: ``create_statement``'s queue parameters, in the statement's order.
CREATED_QUEUE_FIELDS = ("queue", "queue_partition", "queue_priority")


#: The columns of a run ``create_claimed_statement`` inserts that are the same for
#: every run (by field name; the statement's literals in ``_INSERTED``).
NEW_RUN_VALUES = {
    "status": RunStatus.RUNNING,
    "last_step": "",
    "head_snapshot_id": None,
    "idempotency_key": None,
    "failure_reason": "",
    "resume_input": None,
    "claimed_until": None,
    "attempts": 0,
    "wake_at": None,
    "step_errors": None,
    "parent_coordination_id": None,
    "waiting_topic": "",
    "queue": "",
    "queue_partition": "",
    "queue_priority": 0,
    "queued_at": None,
}
#: The columns that are each new run's own.
_NEW_RUN_OWN = {
    "coordination_id",
    "workflow_name",
    "workflow_version",
    "runner",
    "created_at",
    "updated_at",
}


@lru_cache(maxsize=2)
def insert_new_sql(claimed: bool) -> str:
    """PostgreSQL: insert a run unless its coordination or idempotency key exists
    (``ON CONFLICT DO NOTHING``: any unique key).

    *claimed*: inserted claimed by a runner (``_INSERTED``, for
    ``create_claimed_statement``), returning ``claimed_until`` and ``created``. Else
    unclaimed at its head (``_CREATED``, for ``create_statement``), returning the row
    and ``created``, as ``claim_or_create_sql``."""
    inserted = _INSERTED if claimed else _CREATED
    fields = run_fields()
    column = {field.name: f'"{field.column}"' for field in fields}
    assert set(inserted) == set(column), "WorkflowRun's columns changed"
    assert set(NEW_RUN_VALUES) | _NEW_RUN_OWN == set(column), "WorkflowRun's columns changed"
    if claimed:
        returning = f'{column["claimed_until"]}, TRUE AS "created"'
    else:
        returning = f'{", ".join(column[field.name] for field in fields)}, TRUE AS "created"'
    return (
        f'INSERT INTO "{models.WorkflowRun._meta.db_table}" '
        f"({', '.join(column[name] for name in inserted)}) "
        f"VALUES ({', '.join(inserted.values())}) ON CONFLICT DO NOTHING "
        f"RETURNING {returning}"
    )


class ClaimShape(NamedTuple):
    """What ``claim_sql`` builds a claim's SQL for (hashable: one text per shape)."""

    with_input: bool
    check_head: bool
    head_is_null: bool
    running_only: bool
    lazy_commit: bool = False
    #: How many hand-off tokens the run may also be held under.
    held_by: int = 0


@lru_cache(maxsize=64)
def claim_sql(shape: ClaimShape) -> str:
    """PostgreSQL: ``claim`` of an existing run on terms, returning the claimed row.

    *shape*'s *lazy_commit* commits the claim asynchronously (``synchronous_commit`` off for
    its own transaction only, set by the statement itself: one round trip). That
    saves the WAL flush, most of a claim's cost (about 0.8 ms of 1 ms here), and
    risks nothing a step relies on: WAL is flushed in order, so the step's snapshot,
    committed synchronously, makes the claim durable with it; a server crash before
    then forgets a claim whose step wrote nothing yet, as if the worker had died
    before claiming (the step runs again, as after any crash). A claim carrying
    resume input is never lazy: the input must outlive a crash.

    *held_by*: the run may also be held under that many hand-off tokens (parameters
    before the others, and again after the version: ``claim_statement_for``)."""
    with_input, check_head, head_is_null, running_only, lazy_commit, held_by = shape
    fields = run_fields()
    column = {field.name: f'"{field.column}"' for field in fields}
    runner, until, status = column["runner"], column["claimed_until"], column["status"]
    tokens = ", ".join(["%s"] * held_by)
    taken_over = f"run.{runner} <> ''" + (f" AND run.{runner} NOT IN ({tokens})" if held_by else "")
    retry = f"CASE WHEN run.{status} = '{RunStatus.FAILED}' OR ({taken_over}) THEN 1 ELSE 0 END"
    sets = [
        f"{column['attempts']} = run.{column['attempts']} + {retry}",
        f"{runner} = %s",
        f"{until} = STATEMENT_TIMESTAMP() + make_interval(secs => %s)",
        f"{column['updated_at']} = %s",
    ]
    if with_input:
        sets.append(f"{column['resume_input']} = %s")
    where = [
        f"run.{column['coordination_id']} = %s",
        f"run.{column['workflow_name']} = %s",
        f"run.{column['workflow_version']} = %s",
        f"(run.{runner} = '' OR run.{until} IS NULL OR run.{until} < STATEMENT_TIMESTAMP()"
        + (f" OR run.{runner} IN ({tokens}))" if held_by else ")"),
    ]
    if check_head:
        head = f"run.{column['head_snapshot_id']}"
        where.append(f"{head} IS NULL" if head_is_null else f"{head} = %s")
    if running_only:
        where.append(f"run.{status} = '{RunStatus.RUNNING}'")
    if lazy_commit:
        where.append("set_config('synchronous_commit', 'off', true) IS NOT NULL")
    return (
        f'UPDATE "{models.WorkflowRun._meta.db_table}" AS run SET {", ".join(sets)} '
        f"WHERE {' AND '.join(where)} "
        f"RETURNING {', '.join(f'run.{column[field.name]}' for field in fields)}"
    )
