"""Legacy ``enc:v1:`` snapshot values: bound to their row and column but not to their
run, so a row moved into another run still decrypted there (the security review's
sixth finding). The ORM store now refuses them until ``flowwarden_workflows
reencrypt`` binds them (as ``enc:v2:``) to the run they are in; on SQLite and
PostgreSQL."""

from __future__ import annotations

import io
import uuid

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from flowwarden_django.models import SnapshotRecord
from flowwarden_django.workflows.backends.orm import OrmSnapshotStore, _aad
from flowwarden_django.workflows.storage.encryption import (
    LEGACY_PREFIX,
    PREFIX,
    SnapshotDecryptionError,
    generate_key,
)
from flowwarden_django.workflows.storage.snapshot import WorkflowSnapshot, new_snapshot_id
from flowwarden_django.workflows.storage.store import snapshot_stores
from tests.support.lanes import lane_marks

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
    pytest.mark.parametrize(
        "alias", ["default", pytest.param("postgres", marks=lane_marks("postgres"))]
    ),
]

KEY = generate_key()


def legacy_row(store: OrmSnapshotStore, alias: str, cid: str, state: str) -> str:
    """A snapshot written as an earlier version did: ``enc:v1:`` bound to its row and
    column only. Its id."""
    snapshot = store.save(
        WorkflowSnapshot(
            new_snapshot_id(), cid, {"x": state}, agent_name="legacy", seq=None, metadata={"k": "v"}
        )
    )
    cipher = store.cipher
    state_text = cipher.decrypt(
        SnapshotRecord.objects.using(alias).get(pk=snapshot.id).state,
        _aad(cid, snapshot.id, "state"),
    )
    v1 = {
        column: cipher.encrypt(plain, _aad(cid, snapshot.id, column, 1)).replace(
            PREFIX, LEGACY_PREFIX, 1
        )
        for column, plain in (("state", state_text), ("metadata", '{"k": "v"}'))
    }
    SnapshotRecord.objects.using(alias).filter(pk=snapshot.id).update(**v1)
    return snapshot.id


def test_a_legacy_value_is_refused_until_reencrypted_then_bound_to_its_run(alias: str) -> None:
    store = OrmSnapshotStore(using=alias, encryption_keys=[KEY])
    cid, other = f"run-{uuid.uuid4().hex[:8]}", f"run-{uuid.uuid4().hex[:8]}"
    moved = legacy_row(store, alias, cid, "moved")
    kept = legacy_row(store, alias, cid, "kept")

    with pytest.raises(SnapshotDecryptionError, match="flowwarden_workflows reencrypt"):
        store.load(kept)
    # The reported flaw: moved into another run, a v1 row still decrypts there.
    SnapshotRecord.objects.using(alias).filter(pk=moved).update(coordination_id=other)
    lenient = OrmSnapshotStore(using=alias, encryption_keys=[KEY], accept_legacy_envelopes=True)
    assert lenient.load(moved).state == {"x": "moved"}
    SnapshotRecord.objects.using(alias).filter(pk=moved).update(coordination_id=cid)

    assert sum(store.reencrypt_legacy(batch_size=1)) == 2
    assert list(store.reencrypt_legacy()) == []  # nothing left: idempotent
    rows = SnapshotRecord.objects.using(alias).filter(pk__in=[moved, kept])
    assert {(r.state[:7], r.metadata[:7]) for r in rows} == {(PREFIX, PREFIX)}
    assert store.load(kept).state == {"x": "kept"} and store.load(kept).metadata == {"k": "v"}

    # Bound now: moved into another run, it no longer decrypts.
    SnapshotRecord.objects.using(alias).filter(pk=moved).update(coordination_id=other)
    with pytest.raises(SnapshotDecryptionError):
        store.load(moved)


def test_the_reencrypt_command(alias: str) -> None:
    stores = {
        "default": {
            "BACKEND": "flowwarden_django.workflows.backends.orm.OrmSnapshotStore",
            "OPTIONS": {"using": alias, "encryption_keys": [KEY]},
        },
        "plain": {
            "BACKEND": "flowwarden_django.workflows.backends.orm.OrmSnapshotStore",
            "OPTIONS": {"using": alias},
        },
    }
    with override_settings(FLOWWARDEN={"SNAPSHOT_STORES": stores}):
        snapshot_stores.reset()
        try:
            store = OrmSnapshotStore(using=alias, encryption_keys=[KEY])
            snapshot_id = legacy_row(store, alias, "run-cmd", "x")
            out = io.StringIO()
            call_command("flowwarden_workflows", "reencrypt", "--yes", stdout=out)
            assert "Re-encrypted 1 snapshot in snapshot store 'default'" in out.getvalue()
            assert store.load(snapshot_id).state == {"x": "x"}
            with pytest.raises(CommandError, match="does not encrypt"):
                call_command("flowwarden_workflows", "reencrypt", "--store", "plain", "--yes")
        finally:
            snapshot_stores.reset()
