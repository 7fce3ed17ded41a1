"""The checkpoint contract: races, made to happen with real threads."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ...streams.checkpoint import Checkpoint, CheckpointStore
from .values import now_ms, sync_progress, token


class RaceContract:
    """Races made to happen with real threads: anchors never go back, a processed
    write racing a reset is never lost, one initial-sync writer wins each batch.

    Mixed into :class:`~flowwarden_django.testkit.CheckpointStoreContract`, which gives
    the ``store`` and ``name`` fixtures, :meth:`run_threads` and the race sizes
    (``race_writes``…).
    """

    def test_concurrent_anchor_writers_never_go_back(
        self, store: CheckpointStore, name: str
    ) -> None:
        """Two threads write the two anchors while a third reads: neither anchor ever
        goes back, and each ends at the last value its writer wrote."""
        writes = self.race_writes
        base = now_ms()
        done = threading.Event()
        regressions: list[str] = []

        def index(tok: Any) -> int:
            return -1 if tok is None else int(tok["_data"][1:])

        def write(kind: str) -> None:
            save = store.save_seen if kind == "s" else store.save_processed
            for i in range(writes):
                save(name, token(f"{kind}{i:08d}"), base + timedelta(milliseconds=i))

        def seen_writer() -> None:
            write("s")

        def processed_writer() -> None:
            write("p")

        def reader() -> None:
            last = {"seen": -1, "processed": -1}
            while not done.is_set():
                found = store.find(name)
                if found is None:
                    continue
                for anchor, tok in (
                    ("seen", found.last_seen_token),
                    ("processed", found.last_processed_token),
                ):
                    current = index(tok)
                    if current < last[anchor]:
                        regressions.append(f"{anchor} went back from {last[anchor]} to {current}")
                    last[anchor] = current

        def writers() -> None:
            try:
                self.run_threads(seen_writer, processed_writer)
            finally:
                done.set()

        self.run_threads(writers, reader)
        assert not regressions, regressions[:5]
        final = store.find(name)
        assert final.last_seen_token == token(f"s{writes - 1:08d}")
        assert final.last_processed_token == token(f"p{writes - 1:08d}")
        assert final.last_seen_at == base + timedelta(milliseconds=writes - 1)
        assert final.last_processed_at == base + timedelta(milliseconds=writes - 1)

    def test_processed_write_racing_reset_is_never_removed(
        self, store: CheckpointStore, name: str
    ) -> None:
        """A processed anchor written while a reset runs survives it, whatever the order."""
        rounds = self.reset_race_rounds
        now = now_ms()
        barrier = threading.Barrier(3, timeout=120)
        lost: list[str] = []

        def stream(round_: int) -> str:
            return f"{name}-{round_}"

        def resetter() -> None:
            for r in range(rounds):
                barrier.wait()
                store.reset_after_history_lost(
                    stream(r), token(f"fresh{r}"), token(f"dead{r}"), now
                )
                barrier.wait()

        def processor() -> None:
            for r in range(rounds):
                barrier.wait()
                store.save_processed(stream(r), token(f"live{r}"), now)
                barrier.wait()

        def coordinator() -> None:
            for r in range(rounds):
                store.save(
                    Checkpoint(
                        stream(r), "pod-a", None, None, token(f"dead{r}"), now, None, {"round": r}
                    )
                )
                barrier.wait()  # both workers go
                barrier.wait()  # both workers are done
                found = store.find(stream(r))
                if found.last_processed_token != token(f"live{r}"):
                    lost.append(f"round {r}: processed = {found.last_processed_token}")
                elif found.last_seen_token != token(f"fresh{r}") or found.metadata != {"round": r}:
                    lost.append(f"round {r}: {found}")

        self.run_threads(resetter, processor, coordinator)
        assert not lost, lost[:5]

    def test_concurrent_initial_sync_writers_one_wins_each_batch(
        self, store: CheckpointStore, name: str
    ) -> None:
        """Writers race for every batch (the first on a missing record): the condition
        lets exactly one of them write each time."""
        writers, rounds = self.initial_sync_writers, self.initial_sync_race_rounds
        barrier = threading.Barrier(writers, timeout=120)
        wins: list[list[int]] = [[] for _ in range(rounds)]

        def writer(index: int) -> Callable[[], None]:
            def run() -> None:
                for batch in range(rounds):
                    expected = None if batch == 0 else batch - 1
                    barrier.wait()  # all go
                    progress = sync_progress(batch, writer=index)
                    if store.save_initial_sync(name, progress, expected_batch=expected):
                        wins[batch].append(index)
                    barrier.wait()  # all done before the next batch

            return run

        self.run_threads(*(writer(i) for i in range(writers)))
        assert [len(winners) for winners in wins] == [1] * rounds, wins
        final = store.find(name).initial_sync
        assert final == sync_progress(rounds - 1, writer=wins[-1][0])

    def test_initial_sync_racing_record_creation_is_never_refused(
        self, store: CheckpointStore, name: str
    ) -> None:
        """The first progress write (expecting none) races another partial write that
        creates the record: the record had no progress, so the write must succeed,
        and neither write may erase the other."""
        rounds = self.initial_sync_race_rounds
        now = now_ms()
        barrier = threading.Barrier(2, timeout=120)
        refused: list[int] = []

        def stream(round_: int) -> str:
            return f"{name}-{round_}"

        def syncer() -> None:
            for r in range(rounds):
                barrier.wait()
                if not store.save_initial_sync(stream(r), sync_progress(0), expected_batch=None):
                    refused.append(r)

        def creator() -> None:
            for r in range(rounds):
                barrier.wait()
                if r % 2:
                    store.save_heartbeat(stream(r), now)
                else:
                    store.save_processed(stream(r), token(f"p{r}"), now, now)

        self.run_threads(syncer, creator)
        assert not refused, f"refused in rounds {refused[:10]}"
        for r in range(rounds):
            found = store.find(stream(r))
            assert found.initial_sync == sync_progress(0), f"round {r}: {found}"
            assert found.last_heartbeat_at == now, f"round {r}: {found}"
            if r % 2 == 0:
                assert found.last_processed_token == token(f"p{r}"), f"round {r}: {found}"
