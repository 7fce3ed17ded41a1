"""The ``DlqStore`` contract: the reference suite plus the replay lifecycle.

The reference's ten tests (``DlqStoreContractTest``) with exact BSON types, then
what this port adds: listing order, status filter and limit; every status
transition and its compare-and-set; replay failures; purge of expired entries;
delete; and races made to happen with real threads (two claims of one entry,
concurrent saves).

Capabilities come from the store's class: ``supports_replay = False`` (a
publish-only store) skips the tests that read entries back; ``supports_count =
False`` skips the backlog tests. Skipped, not failed, so every combination is valid.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from ..streams.dlq import (
    ACKNOWLEDGED,
    DISCARDED,
    PENDING,
    REPLAYED,
    REPLAYING,
    DeadLetter,
    DlqPolicy,
    DlqStore,
    ErrorInfo,
)
from ._checkpoint_contract.values import now_ms, same_bson, token
from ._harness import AsyncStoreContract, StoreContract, UniqueNameContract

#: The reference's ``DEFAULT_POLICY``.
DEFAULT_POLICY = DlqPolicy(30, True, True)


def make_event(entry_id: str, stream: str, now: datetime, **changes: Any) -> DeadLetter:
    """The reference's ``makeEvent``: an insert with no key, document or token,
    ``ErrorInfo("TestEx", "test")``, one attempt, pending, every timestamp = *now*."""
    entry = DeadLetter(
        id=entry_id,
        stream_name=stream,
        operation_type="insert",
        error=ErrorInfo("TestEx", "test", None),
        attempts=1,
        created_at=now,
        first_attempt_at=now,
        last_attempt_at=now,
    )
    return entry.replace(**changes) if changes else entry


def full_event(entry_id: str, stream: str, now: datetime) -> DeadLetter:
    """The reference's fully populated event."""
    return DeadLetter(
        id=entry_id,
        stream_name=stream,
        operation_type="insert",
        document_key={"_id": "doc-w1"},
        full_document={"status": "NEW", "amount": 42},
        resume_token=token("8263A1B2C3000000012B022C0100296E5A1004"),
        error=ErrorInfo("RuntimeException", "boom", "stack trace here"),
        attempts=3,
        status=PENDING,
        created_at=now,
        first_attempt_at=now,
        last_attempt_at=now,
        expires_at=None,
        metadata={"env": "test"},
    )


class DlqStoreContract(UniqueNameContract, StoreContract):
    """Behaviour every ``DlqStore`` must have. Subclass it and implement
    :meth:`make_store`; override :meth:`clean_state` if the store needs wiping.

    Each test uses ids and stream names of its own, so a shared backend needs no
    cleanup. The race tests run real threads; :meth:`thread_finished` closes the
    Django connections each thread opened.
    """

    #: True when the backend deletes expired entries by itself at a time of its own
    #: choosing (a MongoDB TTL index): ``purge_expired`` may then find fewer to delete,
    #: so its count is checked as an upper bound.
    native_expiry: bool = False
    #: Rounds of the two-claimer race.
    claim_race_rounds: int = 50
    #: Threads and saves per thread in the concurrent-save test.
    save_threads: int = 4
    saves_per_thread: int = 25

    # -- fixtures and helpers ------------------------------------------------------

    name_prefix = "c"

    @staticmethod
    def require_replay(store: DlqStore) -> None:
        """Skip unless the store's class reads entries back (``supports_replay``)."""
        if not type(store).supports_replay:
            pytest.skip(f"{type(store).__name__} does not support replay (reads)")

    @staticmethod
    def require_count(store: DlqStore) -> None:
        """Skip unless the store's class counts its backlog (``supports_count``)."""
        if not type(store).supports_count:
            pytest.skip(f"{type(store).__name__} does not support count")

    def assert_purged(self, purged: int, expected: int) -> None:
        """``purge_expired`` deleted *expected* entries (at most that many with
        :attr:`native_expiry`: the backend may have deleted some already)."""
        if self.native_expiry:
            assert 0 <= purged <= expected, f"purged {purged}, expected at most {expected}"
        else:
            assert purged == expected, f"purged {purged}, expected {expected}"

    def _found(self, store: DlqStore, entry_id: str) -> DeadLetter:
        found = store.find_by_id(entry_id)
        assert found is not None, f"{entry_id} not found"
        return found

    # -- always (reference 1-2) ------------------------------------------------------

    def test_save_accepts_fully_populated_event(self, store: DlqStore, name: str) -> None:
        store.save(full_event(f"{name}-w1", f"{name}-stream", now_ms()), DEFAULT_POLICY)

    def test_save_accepts_nullable_fields(self, store: DlqStore, name: str) -> None:
        entry = make_event(f"{name}-w2", f"{name}-stream", now_ms(), operation_type="delete")
        store.save(entry, DEFAULT_POLICY)

    def test_rejects_bad_input(self, store: DlqStore, name: str) -> None:
        now = now_ms()
        good = make_event(f"{name}-bad", f"{name}-s", now)
        bad = [
            (ValueError, good.replace(created_at=datetime(2026, 1, 1))),
            (TypeError, good.replace(document_key=["not", "a", "document"])),
            (ValueError, good.replace(status="REPROCESSING")),
            (ValueError, good.replace(id="")),
            (ValueError, good.replace(id="x" * 65)),
            (ValueError, good.replace(stream_name="")),
            (TypeError, good.replace(error="boom")),
            (ValueError, good.replace(attempts=-1)),
        ]
        for error, entry in bad:
            with pytest.raises(error):
                store.save(entry, DEFAULT_POLICY)
        if type(store).supports_replay:
            assert store.find_by_id(good.id) is None, "a rejected save must not store anything"
            store.save(good, DEFAULT_POLICY)
            with pytest.raises(ValueError):
                store.transition(good.id, "NOPE", at=now)
            with pytest.raises(ValueError):
                store.transition(good.id, ACKNOWLEDGED, at=datetime(2026, 1, 1))
            with pytest.raises(ValueError):
                store.transition(good.id, ACKNOWLEDGED, from_statuses=(), at=now)
            assert self._found(store, good.id).status == PENDING

    # -- reads (reference 3-7) -------------------------------------------------------

    def test_save_and_find_by_id(self, store: DlqStore, name: str) -> None:
        self.require_replay(store)
        now = now_ms()
        entry_id, stream = f"{name}-w1", f"{name}-stream"
        store.save(full_event(entry_id, stream, now), DEFAULT_POLICY)
        found = self._found(store, entry_id)
        assert (found.id, found.stream_name, found.operation_type) == (entry_id, stream, "insert")
        assert found.document_key == {"_id": "doc-w1"}
        assert found.full_document["status"] == "NEW"
        assert found.full_document["amount"] == 42
        assert type(found.full_document["amount"]) is int, "an int32 must stay an int"
        same_bson(found.resume_token, token("8263A1B2C3000000012B022C0100296E5A1004"))
        assert found.error == ErrorInfo("RuntimeException", "boom", "stack trace here")
        assert (found.attempts, found.status) == (3, PENDING)
        assert found.created_at == now
        assert found.first_attempt_at == now
        assert found.last_attempt_at == now
        assert found.expires_at is None
        assert found.metadata["env"] == "test"
        assert (found.replay_count, found.last_replayed_at) == (0, None)
        assert (found.resolved_at, found.resolved_by, found.note) == (None, "", "")

    def test_find_by_id_returns_none_when_not_found(self, store: DlqStore, name: str) -> None:
        self.require_replay(store)
        assert store.find_by_id(f"{name}-nonexistent") is None

    def test_find_by_stream_name(self, store: DlqStore, name: str) -> None:
        self.require_replay(store)
        now = now_ms()
        a, b, c = f"{name}-A", f"{name}-B", f"{name}-C"
        store.save(make_event(f"{name}-e1", a, now), DEFAULT_POLICY)
        store.save(make_event(f"{name}-e2", a, now), DEFAULT_POLICY)
        store.save(make_event(f"{name}-e3", b, now), DEFAULT_POLICY)
        found_a = store.find_by_stream(a)
        assert sorted(e.id for e in found_a) == [f"{name}-e1", f"{name}-e2"]
        assert all(e.stream_name == a for e in found_a)
        assert [e.id for e in store.find_by_stream(b)] == [f"{name}-e3"]
        assert store.find_by_stream(c) == []

    def test_round_trip_with_nullable_fields(self, store: DlqStore, name: str) -> None:
        self.require_replay(store)
        entry = make_event(f"{name}-n", f"{name}-s", now_ms(), operation_type="delete")
        store.save(entry, DEFAULT_POLICY)
        found = self._found(store, entry.id)
        assert found.document_key is None
        assert found.full_document is None
        assert found.resume_token is None
        assert found.error == ErrorInfo("TestEx", "test", None)
        assert found.expires_at is None
        assert found == entry

    def test_save_overwrites_existing(self, store: DlqStore, name: str) -> None:
        self.require_replay(store)
        now = now_ms()
        entry_id = f"{name}-e1"
        store.save(make_event(entry_id, f"{name}-s", now), DEFAULT_POLICY)
        store.save(
            make_event(entry_id, f"{name}-s-updated", now, operation_type="update", attempts=5),
            DEFAULT_POLICY,
        )
        found = self._found(store, entry_id)
        assert (found.stream_name, found.operation_type, found.attempts) == (
            f"{name}-s-updated",
            "update",
            5,
        )
        assert store.find_by_stream(f"{name}-s") == [], "the old stream must not list it"
        assert [e.id for e in store.find_by_stream(f"{name}-s-updated")] == [entry_id]

    # -- count (reference 8-10) ------------------------------------------------------

    def test_count_is_zero_on_empty_backlog(self, store: DlqStore, name: str) -> None:
        self.require_count(store)
        assert store.count(f"{name}-no-such-stream") == 0

    def test_count_returns_pending_entries_per_stream(self, store: DlqStore, name: str) -> None:
        self.require_count(store)
        now = now_ms()
        a, b = f"{name}-A", f"{name}-B"
        store.save(make_event(f"{name}-1", a, now), DEFAULT_POLICY)
        store.save(make_event(f"{name}-2", a, now), DEFAULT_POLICY)
        store.save(make_event(f"{name}-3", b, now), DEFAULT_POLICY)
        assert store.count(a) == 2
        assert store.count(b) == 1
        assert store.count(f"{name}-C") == 0

    def test_count_ignores_non_pending_entries(self, store: DlqStore, name: str) -> None:
        self.require_count(store)
        now = now_ms()
        a = f"{name}-A"
        store.save(make_event(f"{name}-p1", a, now), DEFAULT_POLICY)
        for index, status in enumerate((REPLAYING, REPLAYED, ACKNOWLEDGED, DISCARDED)):
            store.save(make_event(f"{name}-x{index}", a, now, status=status), DEFAULT_POLICY)
        assert store.count(a) == 1

    # -- beyond the reference: BSON, time zones, listing ---------------------------------

    def test_bson_values_round_trip_with_their_types(self, store: DlqStore, name: str) -> None:
        self.require_replay(store)
        bson = pytest.importorskip("bson")
        from bson import Binary, Decimal128, Int64, ObjectId, Timestamp

        key = {"_id": ObjectId("65f0c0ffee0000000000abcd")}
        document = {
            "_id": ObjectId("65f0c0ffee0000000000abcd"),
            "amount": 42,
            "big": Int64(2**40),
            "small": Int64(7),
            "price": Decimal128("12.50"),
            "ratio": 0.25,
            "when": datetime(2026, 5, 1, 8, 30, 0, 123000),
            "raw": Binary(b"\x00\xff", 0),
            "uuid": Binary(uuid.UUID(int=9).bytes, 4),
            "tags": ["a", 1, Int64(2), {"deep": None}],
            "flag": False,
        }
        resume = {"_data": "82AA", "ts": Timestamp(1_700_000_000, 3), "n": Int64(5)}
        now = now_ms()
        entry = make_event(
            f"{name}-bson",
            f"{name}-s",
            now,
            document_key=key,
            full_document=document,
            resume_token=resume,
        )
        store.save(entry, DEFAULT_POLICY)
        found = self._found(store, entry.id)
        for field, original in (
            ("document_key", key),
            ("full_document", document),
            ("resume_token", resume),
        ):
            expected = bson.decode(bson.encode(original))
            same_bson(getattr(found, field), expected, field)

    def test_metadata_round_trips(self, store: DlqStore, name: str) -> None:
        self.require_replay(store)
        metadata = {"env": "test", "nested": {"n": 3, "tags": ["a", "b"]}, "ok": True}
        entry = make_event(f"{name}-m", f"{name}-s", now_ms(), metadata=metadata)
        store.save(entry, DEFAULT_POLICY)
        assert dict(self._found(store, entry.id).metadata) == metadata

    def test_timestamps_come_back_in_utc(self, store: DlqStore, name: str) -> None:
        """Whatever zone goes in, UTC comes out, to at least millisecond precision."""
        self.require_replay(store)
        paris = timezone(timedelta(hours=2))
        at = datetime(2026, 6, 1, 12, 30, 15, 123456, tzinfo=paris)
        entry = make_event(f"{name}-tz", f"{name}-s", at, expires_at=at + timedelta(days=3650))
        store.save(entry, DEFAULT_POLICY)
        found = self._found(store, entry.id)
        for value, sent in (
            (found.created_at, at),
            (found.first_attempt_at, at),
            (found.last_attempt_at, at),
            (found.expires_at, entry.expires_at),
        ):
            assert value.utcoffset() == timedelta(0)
            assert timedelta(0) <= sent - value < timedelta(milliseconds=1)

    def test_retention_expires_at_is_kept(self, store: DlqStore, name: str) -> None:
        """The caller computes ``expires_at`` from the policy; the store keeps it."""
        self.require_replay(store)
        now = now_ms()
        policy = DlqPolicy(retention_days=7)
        entry = make_event(f"{name}-r", f"{name}-s", now, expires_at=policy.compute_expires_at(now))
        store.save(entry, policy)
        assert self._found(store, entry.id).expires_at == now + timedelta(days=7)
        forever = make_event(f"{name}-f", f"{name}-s", now)
        store.save(forever, DlqPolicy(retention_days=0))
        assert self._found(store, forever.id).expires_at is None

    def test_find_by_stream_newest_first_with_status_and_limit(
        self, store: DlqStore, name: str
    ) -> None:
        self.require_replay(store)
        now = now_ms()
        stream = f"{name}-s"
        ids = [f"{name}-{i}" for i in range(4)]
        for index, entry_id in enumerate(ids):
            created = now + timedelta(seconds=index)
            status = ACKNOWLEDGED if index == 2 else PENDING
            store.save(make_event(entry_id, stream, created, status=status), DEFAULT_POLICY)
        store.save(make_event(f"{name}-other", f"{name}-t", now), DEFAULT_POLICY)

        def listed(**kwargs: Any) -> list[str]:
            return [entry.id for entry in store.find_by_stream(stream, **kwargs)]

        assert listed() == [ids[3], ids[2], ids[1], ids[0]]
        assert listed(limit=2) == [ids[3], ids[2]]
        assert listed(limit=0) == []
        assert listed(limit=10) == [ids[3], ids[2], ids[1], ids[0]]
        assert listed(status=PENDING) == [ids[3], ids[1], ids[0]]
        assert listed(status=PENDING, limit=2) == [ids[3], ids[1]]
        assert listed(status=ACKNOWLEDGED) == [ids[2]]
        assert listed(status=DISCARDED) == []

    # -- transitions -----------------------------------------------------------------

    @pytest.mark.parametrize("to_status", [ACKNOWLEDGED, DISCARDED])
    def test_settling_records_who_when_and_why(
        self, store: DlqStore, name: str, to_status: str
    ) -> None:
        self.require_replay(store)
        now = now_ms()
        entry = full_event(f"{name}-e", f"{name}-s", now)
        store.save(entry, DEFAULT_POLICY)
        at = now + timedelta(seconds=5)
        assert store.transition(entry.id, to_status, at=at, by="alice", note="fixed by hand")
        found = self._found(store, entry.id)
        assert found.status == to_status
        assert (found.resolved_at, found.resolved_by, found.note) == (at, "alice", "fixed by hand")
        assert (found.replay_count, found.last_replayed_at) == (0, None)
        assert found.replace(status=PENDING, resolved_at=None, resolved_by="", note="") == entry
        if type(store).supports_count:
            assert store.count(entry.stream_name) == 0

    def test_transition_from_the_wrong_status_changes_nothing(
        self, store: DlqStore, name: str
    ) -> None:
        self.require_replay(store)
        now = now_ms()
        later = now + timedelta(seconds=9)
        acked = make_event(f"{name}-a", f"{name}-s", now)
        store.save(acked, DEFAULT_POLICY)
        assert store.transition(acked.id, ACKNOWLEDGED, at=now, by="alice", note="n")
        before = self._found(store, acked.id)
        assert not store.transition(acked.id, REPLAYING, at=later, by="bob")
        assert not store.transition(acked.id, DISCARDED, at=later, by="bob", note="other")
        assert not store.record_replay_failure(acked.id, ErrorInfo("X", "y"), at=later)
        assert self._found(store, acked.id) == before

        pending = make_event(f"{name}-p", f"{name}-s", now)
        store.save(pending, DEFAULT_POLICY)
        assert not store.transition(
            pending.id, REPLAYED, from_statuses=(REPLAYING,), at=later, by="bob"
        )
        assert not store.record_replay_failure(pending.id, ErrorInfo("X", "y"), at=later)
        assert self._found(store, pending.id) == pending

    def test_transition_of_a_missing_entry_is_false(self, store: DlqStore, name: str) -> None:
        self.require_replay(store)
        now = now_ms()
        missing = f"{name}-missing"
        assert not store.transition(missing, ACKNOWLEDGED, at=now)
        assert not store.transition(missing, REPLAYED, from_statuses=(REPLAYING,), at=now)
        assert not store.record_replay_failure(missing, ErrorInfo("X", "y"), at=now)
        assert store.find_by_id(missing) is None

    def test_transition_accepts_any_of_several_statuses(self, store: DlqStore, name: str) -> None:
        self.require_replay(store)
        now = now_ms()
        entry = make_event(f"{name}-e", f"{name}-s", now, status=ACKNOWLEDGED)
        store.save(entry, DEFAULT_POLICY)
        assert store.transition(
            entry.id, DISCARDED, from_statuses=(PENDING, ACKNOWLEDGED), at=now, by="ops"
        )
        assert self._found(store, entry.id).status == DISCARDED

    def test_successful_replay_counts_it(self, store: DlqStore, name: str) -> None:
        self.require_replay(store)
        now = now_ms()
        entry = full_event(f"{name}-e", f"{name}-s", now)
        store.save(entry, DEFAULT_POLICY)
        claimed_at, done_at = now + timedelta(seconds=1), now + timedelta(seconds=2)
        assert store.transition(entry.id, REPLAYING, at=claimed_at, by="bob")
        claimed = self._found(store, entry.id)
        assert claimed.status == REPLAYING
        assert (claimed.replay_count, claimed.resolved_at) == (0, None)
        if type(store).supports_count:
            assert store.count(entry.stream_name) == 0, "a claimed entry is not in the backlog"
        assert store.transition(
            entry.id, REPLAYED, from_statuses=(REPLAYING,), at=done_at, by="bob", note="replayed"
        )
        found = self._found(store, entry.id)
        assert found.status == REPLAYED
        assert (found.replay_count, found.last_replayed_at) == (1, done_at)
        assert (found.resolved_at, found.resolved_by, found.note) == (done_at, "bob", "replayed")
        assert found.error == entry.error
        assert found.full_document == entry.full_document

    def test_failed_replay_goes_back_to_pending(self, store: DlqStore, name: str) -> None:
        self.require_replay(store)
        now = now_ms()
        entry = full_event(f"{name}-e", f"{name}-s", now)
        store.save(entry, DEFAULT_POLICY)
        error = ErrorInfo("myapp.errors.StillBroken", "again", "Traceback ...")
        for round_ in (1, 2):
            at = now + timedelta(seconds=round_)
            assert store.transition(entry.id, REPLAYING, at=at)
            assert store.record_replay_failure(entry.id, error, at=at)
            found = self._found(store, entry.id)
            assert found.status == PENDING
            assert found.error == error
            assert (found.replay_count, found.last_replayed_at) == (round_, at)
            assert found.resolved_at is None
            assert found.attempts == entry.attempts
            if type(store).supports_count:
                assert store.count(entry.stream_name) == 1
        assert not store.record_replay_failure(entry.id, error, at=now), "not REPLAYING any more"

    # -- purge, delete ----------------------------------------------------------------

    def test_purge_expired_removes_only_expired_entries(self, store: DlqStore, name: str) -> None:
        self.require_replay(store)
        now = now_ms()
        stream = f"{name}-s"
        old = now - timedelta(days=31)
        expired = make_event(f"{name}-old", stream, old, expires_at=now - timedelta(hours=1))
        expired_acked = make_event(
            f"{name}-ack", stream, old, status=ACKNOWLEDGED, expires_at=now - timedelta(days=1)
        )
        live = make_event(f"{name}-live", stream, now, expires_at=now + timedelta(days=1))
        forever = make_event(f"{name}-forever", stream, old)
        for entry in (expired, expired_acked, live, forever):
            store.save(entry, DEFAULT_POLICY)
        self.assert_purged(store.purge_expired(now), 2)
        assert store.find_by_id(expired.id) is None
        assert store.find_by_id(expired_acked.id) is None
        assert self._found(store, live.id) == live
        assert self._found(store, forever.id) == forever
        assert sorted(e.id for e in store.find_by_stream(stream)) == sorted([forever.id, live.id])
        if type(store).supports_count:
            assert store.count(stream) == 2
        assert store.purge_expired(now) == 0
        self.assert_purged(store.purge_expired(now + timedelta(days=2)), 1)
        assert store.find_by_id(live.id) is None
        assert self._found(store, forever.id) == forever

    def test_delete(self, store: DlqStore, name: str) -> None:
        self.require_replay(store)
        now = now_ms()
        entry = make_event(f"{name}-d", f"{name}-s", now)
        keep = make_event(f"{name}-k", f"{name}-s", now)
        store.save(entry, DEFAULT_POLICY)
        store.save(keep, DEFAULT_POLICY)
        store.delete(entry.id)
        assert store.find_by_id(entry.id) is None
        assert [e.id for e in store.find_by_stream(entry.stream_name)] == [keep.id]
        if type(store).supports_count:
            assert store.count(entry.stream_name) == 1
        store.delete(entry.id)  # missing: no error
        store.delete(f"{name}-never")

    # -- races, made to happen ----------------------------------------------------------

    def test_two_claims_of_one_entry_exactly_one_wins(self, store: DlqStore, name: str) -> None:
        """Two threads move the same entry PENDING → REPLAYING at once, many times over:
        every time exactly one of them wins."""
        self.require_replay(store)
        rounds = self.claim_race_rounds
        now = now_ms()
        stream = f"{name}-s"
        ids = [f"{name}-{r}" for r in range(rounds)]
        for entry_id in ids:
            store.save(make_event(entry_id, stream, now), DEFAULT_POLICY)
        barrier = threading.Barrier(2, timeout=120)
        wins: dict[str, list[bool]] = {"a": [], "b": []}

        def claimer(who: str) -> Callable[[], None]:
            def run() -> None:
                for entry_id in ids:
                    barrier.wait()
                    wins[who].append(store.transition(entry_id, REPLAYING, at=now, by=who))

            return run

        self.run_threads(claimer("a"), claimer("b"))
        both = [r for r in range(rounds) if wins["a"][r] and wins["b"][r]]
        neither = [r for r in range(rounds) if not wins["a"][r] and not wins["b"][r]]
        assert not both, f"both claims won in rounds {both[:10]}"
        assert not neither, f"no claim won in rounds {neither[:10]}"
        assert all(self._found(store, entry_id).status == REPLAYING for entry_id in ids)
        if type(store).supports_count:
            assert store.count(stream) == 0

    def test_concurrent_saves_of_different_ids_all_land(self, store: DlqStore, name: str) -> None:
        self.require_replay(store)
        now = now_ms()
        stream = f"{name}-s"

        def saver(worker: int) -> Callable[[], None]:
            def run() -> None:
                for i in range(self.saves_per_thread):
                    created = now + timedelta(milliseconds=i)
                    entry = make_event(f"{name}-{worker}-{i}", stream, created)
                    store.save(entry, DEFAULT_POLICY)

            return run

        self.run_threads(*(saver(w) for w in range(self.save_threads)))
        expected = {
            f"{name}-{w}-{i}"
            for w in range(self.save_threads)
            for i in range(self.saves_per_thread)
        }
        assert {entry.id for entry in store.find_by_stream(stream)} == expected
        if type(store).supports_count:
            assert store.count(stream) == len(expected)

    def test_concurrent_saves_of_one_id_leave_one_entry(self, store: DlqStore, name: str) -> None:
        """Upserts of the same id from several threads never fail and leave one entry."""
        self.require_replay(store)
        now = now_ms()
        entry_id, stream = f"{name}-same", f"{name}-s"
        barrier = threading.Barrier(self.save_threads, timeout=120)

        def saver(worker: int) -> Callable[[], None]:
            def run() -> None:
                for i in range(10):
                    barrier.wait()
                    entry = make_event(entry_id, stream, now, attempts=worker * 100 + i)
                    store.save(entry, DEFAULT_POLICY)

            return run

        self.run_threads(*(saver(w) for w in range(self.save_threads)))
        assert [entry.id for entry in store.find_by_stream(stream)] == [entry_id]
        assert self._found(store, entry_id).attempts % 100 == 9
        if type(store).supports_count:
            assert store.count(stream) == 1


#: The operations :class:`AsyncDlqStoreContract` drives through their ``a…`` twins.
DLQ_OPERATIONS = DlqStore._thread_twinned


class AsyncDlqStoreContract(AsyncStoreContract, DlqStoreContract):
    """The same contract through the async API (``asave``, ``afind_by_id``…).

    Every test of :class:`DlqStoreContract` runs against a stand-in whose sync
    operations await the store's ``a…`` variants on an event loop
    (``testkit/_async_driven.py``); the stand-in carries the store class's
    ``supports_*`` flags, so the capability skips are the same. Then a test of its
    own awaits many calls at once. Subclass it like the sync contract, or put it
    first in front of an existing sync test class.
    """

    async_operations = DLQ_OPERATIONS

    def test_gathered_async_saves_and_claims(self, store: Any, name: str) -> None:
        real: DlqStore = store.driven
        self.require_replay(real)
        now = now_ms()
        stream = f"{name}-s"
        ids = [f"{name}-{index}" for index in range(8)]

        async def scenario() -> tuple[list[bool], list[DeadLetter | None]]:
            await asyncio.gather(
                *(real.asave(make_event(i, stream, now), DEFAULT_POLICY) for i in ids)
            )
            claims = await asyncio.gather(
                *(real.atransition(i, REPLAYING, at=now) for i in ids),
                *(real.atransition(i, REPLAYING, at=now) for i in ids),
            )
            found = await asyncio.gather(*(real.afind_by_id(i) for i in ids))
            return list(claims), list(found)

        claims, found = async_to_sync(scenario)()
        assert all(claims[i] != claims[i + len(ids)] for i in range(len(ids))), claims
        assert [entry.status if entry else None for entry in found] == [REPLAYING] * len(ids)
