"""``prune`` and ``reencrypt``: deleting old snapshots and binding legacy encrypted
values to their run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.core.management.base import CommandError
from django.utils import timezone

from ...models import SnapshotRecord
from ...workflows import CheckpointQuery, RunStatus, SnapshotStore
from ...workflows.backends.orm import OrmSnapshotStore
from ...workflows.storage.retention import PruneRow, plan_prune
from ..base import ActionCommand
from .inputs import confirm, parse_age
from .lookup import run_rows, store_db, store_for
from .output import COMMAND, seq

#: Snapshots per page when a store is read through ``list``.
PAGE = 500


class MaintenanceActions(ActionCommand):
    """``prune`` and ``reencrypt`` of ``manage.py flowwarden_workflows``."""

    #: Seconds between progress lines of long-running actions (prune).
    progress_interval = 2.0

    def handle_prune(
        self,
        *,
        keep_last: int | None,
        older_than: str | None,
        coordination: str | None,
        store: str | None,
        dry_run: bool,
        **options: Any,
    ) -> None:
        if keep_last is None and older_than is None:
            raise CommandError(
                "prune needs --keep-last N, --older-than AGE or both, for example "
                f"`{COMMAND} prune --keep-last 10 --older-than 30d`."
            )
        age = None if older_than is None else parse_age(older_than)
        backend, where = store_for(None, store)
        rules = _rules_text(keep_last, older_than)
        scope = f"coordination {coordination!r}" if coordination else "every coordination"
        protected = _waiting_heads(backend)
        if dry_run:
            self._dry_run(backend, where, keep_last, age, coordination, protected, rules)
            return
        self.stdout.write(
            f"Prune snapshots of {scope} in {where}: keep {rules}. Never deleted: "
            "each coordination's newest snapshot, the ancestors of a kept fork, the head of "
            "a run waiting for approval."
        )
        self.stdout.write("Run with --dry-run first to see what would be deleted.")
        if not confirm(self, "Prune", **options):
            return
        cids = [coordination] if coordination else list(_coordinations(backend))
        removed = 0
        started = last = time.monotonic()
        for done, cid in enumerate(cids, 1):
            try:
                removed += backend.prune(
                    keep_last, age, coordination_id=cid, protected_ids=protected
                )
            except NotImplementedError as exc:
                raise CommandError(
                    f"{exc}: {where} ({type(backend).__name__}) cannot prune. "
                    "Use a store that implements SnapshotStore.prune."
                ) from exc
            now = time.monotonic()
            if now - last >= self.progress_interval and done < len(cids):
                last = now
                self.stdout.write(
                    f"  {done}/{len(cids)} coordinations, {removed} snapshots deleted "
                    f"({now - started:.0f}s)"
                )
        self.stdout.write(
            self.style.SUCCESS(
                f"Deleted {removed} snapshot{'s' if removed != 1 else ''} from "
                f"{len(cids)} coordination{'s' if len(cids) != 1 else ''} in {where}."
            )
        )

    def _dry_run(
        self,
        backend: SnapshotStore,
        where: str,
        keep_last: int | None,
        age: timedelta | None,
        coordination: str | None,
        protected: set[str],
        rules: str,
    ) -> None:
        cutoff = None if age is None else timezone.now() - age
        protected = protected | set(_store_protected(backend))
        cids = [coordination] if coordination else list(_coordinations(backend))
        total = touched = 0
        self.stdout.write(f"Dry run: keep {rules}; nothing is deleted.")
        for cid in cids:
            snapshots = backend.list(CheckpointQuery.for_coordination(cid))
            plan = plan_prune(
                [PruneRow(s.id, s.parent_id, seq(s), s.created_at) for s in snapshots],
                keep_last=keep_last,
                cutoff=cutoff,
                protected=protected,
            )
            if plan:
                touched += 1
                total += len(plan)
                self.stdout.write(
                    f"  {cid}: would delete {len(plan)} of {len(snapshots)} snapshots"
                )
        self.stdout.write(
            f"Would delete {total} snapshot{'s' if total != 1 else ''} from {touched} of "
            f"{len(cids)} coordination{'s' if len(cids) != 1 else ''} in {where}."
        )

    def handle_reencrypt(self, *, store: str | None, **options: Any) -> None:
        backend, where = store_for(None, store)
        rebind = getattr(backend, "reencrypt_legacy", None)
        if rebind is None or not backend.encrypts_at_rest:
            raise CommandError(
                f"{where} ({type(backend).__name__}) does not encrypt with enc:v1 values "
                "to bind; name an encrypting OrmSnapshotStore with --store ALIAS."
            )
        self.stdout.write(
            f"Re-encrypt the legacy enc:v1 values of {where} as enc:v2, each bound to the "
            "run its row is in now."
        )
        if not confirm(self, "Re-encrypt", **options):
            return
        total = 0
        started = time.monotonic()
        for batch in rebind():
            total += batch
            self.stdout.write(
                f"  {total} snapshots re-encrypted ({time.monotonic() - started:.0f}s)"
            )
        self.stdout.write(
            self.style.SUCCESS(
                f"Re-encrypted {total} snapshot{'s' if total != 1 else ''} in {where}; "
                "none holds an enc:v1 value any more."
            )
        )


def _rules_text(keep_last: int | None, older_than: str | None) -> str:
    rules = []
    if keep_last is not None:
        rules.append(f"the last {keep_last} of each coordination")
    if older_than is not None:
        rules.append(f"those younger than {older_than.strip()}")
    return " and ".join(rules)


def _coordinations(store: SnapshotStore) -> Iterator[str]:
    """Every coordination with snapshots in *store*: one query on an ORM store, else
    a pass over ``list`` a page at a time."""
    if isinstance(store, OrmSnapshotStore):
        rows = SnapshotRecord.objects.using(store_db(store))
        yield from (
            rows.order_by("coordination_id").values_list("coordination_id", flat=True).distinct()
        )
        return
    seen: set[str] = set()
    query: CheckpointQuery | None = CheckpointQuery(limit=PAGE)
    while query is not None:
        page = store.list(query)
        for snapshot in page:
            if snapshot.coordination_id not in seen:
                seen.add(snapshot.coordination_id)
                yield snapshot.coordination_id
        query = query.next_page(page)


def _waiting_heads(store: SnapshotStore) -> set[str]:
    """Heads of runs waiting for approval, from the run database of *store* (its own
    database for an ORM store)."""
    using = store_db(store) if isinstance(store, OrmSnapshotStore) else None
    waiting = run_rows(using).filter(status=RunStatus.WAITING).exclude(head_snapshot_id=None)
    return set(waiting.values_list("head_snapshot_id", flat=True))


def _store_protected(store: SnapshotStore) -> list[str]:
    """The ids a store's own ``protect`` hook keeps (the in-memory store has one)."""
    protect = getattr(store, "protect", None)
    return list(protect()) if callable(protect) else []
