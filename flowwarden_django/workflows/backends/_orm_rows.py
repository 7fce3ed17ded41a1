"""How the ORM snapshot store writes a snapshot as its row and reads it back: the
state serialized and, with a key, state and metadata encrypted and bound to their run,
row and column; and the rewrite of legacy ``enc:v1:`` values bound to their run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from django.db.models import Q

from ...models import SnapshotRecord
from ..storage.encryption import LEGACY_PREFIX, SnapshotDecryptionError, envelope_version, reveal
from ..storage.snapshot import WorkflowSnapshot
from ._common import dump_metadata, load_metadata, unreadable
from ._orm_sql import SnapshotRow

if TYPE_CHECKING:
    from ..storage.encryption import AesGcmCipher
    from ..storage.serializers import StateSerializer


def column_aad(
    coordination_id: str, snapshot_id: str, column: str, version: int | None = 2
) -> bytes:
    """Binds an encrypted value to its coordination, row and column (``enc:v1:``
    values, written before, to their row and column only)."""
    if version == 1:
        return f"flowwarden:snapshot:{snapshot_id}:{column}".encode()
    coordination = f"{len(coordination_id)}:{coordination_id}"
    return f"flowwarden:snapshot:v2:{coordination}:{snapshot_id}:{column}".encode()


class SnapshotRowsMixin:
    """``OrmSnapshotStore``'s rows: a snapshot as the columns it writes, and a row (or a
    raw one, ``SnapshotRow``) as the snapshot it reads, decrypted and deserialized."""

    serializer: StateSerializer
    cipher: AesGcmCipher | None
    require_encryption: bool
    accept_legacy_envelopes: bool

    def _columns(self, snapshot: WorkflowSnapshot) -> dict[str, Any]:
        text, label = self.serializer.dumps(snapshot.state)
        metadata = dump_metadata(snapshot.metadata)
        if self.cipher is not None:
            cid = snapshot.coordination_id
            text = self.cipher.encrypt(text, column_aad(cid, snapshot.id, "state"))
            metadata = self.cipher.encrypt(metadata, column_aad(cid, snapshot.id, "metadata"))
        return {
            "parent_id": snapshot.parent_id,
            "coordination_id": snapshot.coordination_id,
            "agent_name": snapshot.agent_name,
            "state": text,
            "state_type": label[:255],
            "metadata": metadata,
            "created_at": snapshot.created_at,
        }

    def _reveal(self, row: SnapshotRecord | SnapshotRow, column: str) -> str | None:
        text = getattr(row, column)
        version = envelope_version(text)
        if version == 1 and not self.accept_legacy_envelopes:
            raise SnapshotDecryptionError(
                f"snapshot {row.id} holds a legacy enc:v1 {column}, which is not bound to "
                "its run; run `manage.py flowwarden_workflows reencrypt` once to bind it"
            )
        aad = column_aad(row.coordination_id, row.id, column, version)
        return reveal(text, self.cipher, aad, require_encryption=self.require_encryption)

    def reencrypt_legacy(self, *, batch_size: int = 500) -> Iterator[int]:
        """Re-encrypt every ``enc:v1:`` value as ``enc:v2:``, bound to the run its row
        is in now; yields how many rows each batch rewrote. Each row is rewritten by
        one conditional ``UPDATE`` (only while it still holds what was read), so it is
        safe to run beside a live store and to run again."""
        if self.cipher is None:
            raise ValueError("this store has no encryption key: nothing to re-encrypt")
        legacy = Q(state__startswith=LEGACY_PREFIX) | Q(metadata__startswith=LEGACY_PREFIX)
        after = ""
        while True:
            rows = list(
                self._rows()
                .filter(legacy, id__gt=after)
                .order_by("id")
                .values_list("id", "coordination_id", "state", "metadata")[:batch_size]
            )
            if not rows:
                return
            done = 0
            for snapshot_id, cid, state, metadata in rows:
                fresh = {
                    column: self._rebind(cid, snapshot_id, column, text)
                    for column, text in (("state", state), ("metadata", metadata))
                }
                done += (
                    self._rows()
                    .filter(id=snapshot_id, state=state, metadata=metadata)
                    .update(**fresh)
                )
            after = rows[-1][0]
            yield done

    def _rebind(self, cid: str, snapshot_id: str, column: str, text: str | None) -> str | None:
        if envelope_version(text) != 1:
            return text
        plain = self.cipher.decrypt(text, column_aad(cid, snapshot_id, column, 1))
        return self.cipher.encrypt(plain, column_aad(cid, snapshot_id, column))

    def _decode_listed(self, row: SnapshotRecord, with_state: bool) -> WorkflowSnapshot:
        try:
            return self._decode(row, with_state)
        except Exception as exc:  # one bad row must not fail the listing
            return unreadable(row, exc)

    def _decode(
        self, row: SnapshotRecord | SnapshotRow, with_state: bool = True
    ) -> WorkflowSnapshot:
        state = None
        if with_state:
            text = self._reveal(row, "state")
            state = None if text is None else self.serializer.loads(text, row.state_type)
        metadata = self._reveal(row, "metadata")
        return WorkflowSnapshot(
            id=row.id,
            coordination_id=row.coordination_id,
            state=state,
            parent_id=row.parent_id,
            agent_name=row.agent_name,
            seq=row.seq,
            metadata=load_metadata(metadata),
            created_at=row.created_at,
        )
