"""The snapshot contract: encryption at rest, for stores that encrypt."""

from __future__ import annotations

from typing import Any

import pytest

from ...workflows.storage.snapshot import CheckpointQuery, UnreadableSnapshot, WorkflowSnapshot
from ...workflows.storage.store import SnapshotStore
from .part import SnapshotContractPart


class EncryptionContract(SnapshotContractPart):
    """Encryption at rest (skipped unless ``make_encrypting_store`` gives a store):
    unreadable without the key, failing closed, bound to the coordination, keys
    rotated.
    """

    # -- encryption at rest (stores that encrypt) --------------------------------------

    def _encrypting(self, keys: list[str] | None, **options: Any) -> SnapshotStore:
        store = self.make_encrypting_store(keys, **options)
        if store is None:
            pytest.skip("this store does not encrypt at rest")
        return store

    @staticmethod
    def _keys() -> tuple[str, str]:
        pytest.importorskip("cryptography")
        from ...workflows.storage.encryption import generate_key

        return generate_key(), generate_key()

    def test_encrypted_rows_are_unreadable_without_the_key(self, cid: str) -> None:
        from ...workflows.storage.encryption import SnapshotDecryptionError

        key, _ = self._keys()
        encrypting = self._encrypting([key])
        assert encrypting.encrypts_at_rest
        stored = encrypting.save(
            WorkflowSnapshot.root(cid, {"secret": "s3cr3t-state"}, metadata={"pin": "s3cr3t-meta"})
        )
        raw = self.raw_texts(encrypting, stored.id)
        if raw is not None:
            assert all(text.startswith("enc:v2:") for text in raw)
            assert "s3cr3t" not in "".join(raw)
        plain = self._encrypting(None)
        assert not plain.encrypts_at_rest
        with pytest.raises(SnapshotDecryptionError):
            plain.load(stored.id)
        with pytest.raises(SnapshotDecryptionError):
            plain.latest(cid)
        assert encrypting.load(stored.id) == stored

    def test_a_wrong_key_fails_closed(self, cid: str) -> None:
        from ...workflows.storage.encryption import SnapshotDecryptionError

        key, wrong = self._keys()
        stored = self._encrypting([key]).save(WorkflowSnapshot.root(cid, {"v": 1}))
        other = self._encrypting([wrong])
        with pytest.raises(SnapshotDecryptionError):
            other.load(stored.id)
        # A listing reports the row it cannot read instead of failing as a whole.
        for with_state in (True, False):
            query = CheckpointQuery(coordination_id=cid, with_state=with_state)
            (row,) = other.list(query)
            assert isinstance(row, UnreadableSnapshot) and row.error
            assert (row.id, row.seq, row.state) == (stored.id, stored.seq, None)

    def test_plaintext_rows_are_refused_by_an_encrypting_store(self, cid: str) -> None:
        from ...workflows.storage.encryption import SnapshotDecryptionError

        key, _ = self._keys()
        planted = self._encrypting(None).save(WorkflowSnapshot.root(cid, {"v": "planted"}))
        encrypting = self._encrypting([key])
        with pytest.raises(SnapshotDecryptionError, match="plaintext"):
            encrypting.load(planted.id)
        with pytest.raises(SnapshotDecryptionError):
            encrypting.latest(cid)
        (row,) = encrypting.list(CheckpointQuery(coordination_id=cid))
        assert isinstance(row, UnreadableSnapshot)

    def test_an_encrypted_row_moved_to_another_coordination_does_not_decrypt(
        self, cid: str
    ) -> None:
        from ...workflows.storage.encryption import SnapshotDecryptionError

        key, _ = self._keys()
        encrypting = self._encrypting([key])
        secret = encrypting.save(WorkflowSnapshot.root(cid, {"v": "approved amount"}))
        if not self.move_row(encrypting, secret.id, f"{cid}-other"):
            pytest.skip("this contract cannot rewrite stored rows")
        with pytest.raises(SnapshotDecryptionError):
            encrypting.load(secret.id)

    def test_plaintext_rows_stay_readable_after_enabling(self, cid: str) -> None:
        key, _ = self._keys()
        old = self._encrypting(None).save(
            WorkflowSnapshot.root(cid, {"v": "plain"}, metadata={"m": "1"})
        )
        encrypting = self._encrypting([key], require_encryption=False)
        assert encrypting.load(old.id) == old
        new = encrypting.save(old.derive_with({"v": "sealed"}))
        assert self.ids(encrypting.list(CheckpointQuery(coordination_id=cid))) == [old.id, new.id]
        child = encrypting.fork(old.id, {"v": "forked"})
        assert encrypting.load(child.id).metadata == {"m": "1"}

    def test_rotated_keys_read_old_rows(self, cid: str) -> None:
        from ...workflows.storage.encryption import SnapshotDecryptionError

        old_key, new_key = self._keys()
        before = self._encrypting([old_key]).save(WorkflowSnapshot.root(cid, {"v": 1}))
        rotated = self._encrypting([new_key, old_key])
        assert rotated.load(before.id) == before
        after = rotated.save(before.derive_with({"v": 2}))
        with pytest.raises(SnapshotDecryptionError):
            self._encrypting([old_key]).load(after.id)
        assert self._encrypting([new_key]).load(after.id) == after
