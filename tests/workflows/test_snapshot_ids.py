"""Snapshot ids: UUID4-shaped, unique, and never repeated by a forked child."""

from __future__ import annotations

import os
import uuid

from flowwarden_django.workflows.storage.snapshot import new_snapshot_id


def test_ids_are_uuid4_hex_and_unique() -> None:
    ids = [new_snapshot_id() for _ in range(100_000)]
    assert len(set(ids)) == len(ids)
    for value in ids[:100]:
        parsed = uuid.UUID(value)
        assert parsed.hex == value and parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def test_threads_drawing_at_once_never_share_an_id() -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        batches = list(pool.map(lambda _: [new_snapshot_id() for _ in range(5000)], range(8)))
    ids = [value for batch in batches for value in batch]
    assert len(set(ids)) == len(ids) == 40_000


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    """A prefork worker's children each draw their own ids, not the parent's next ones
    (by the process id: a server's plain fork() runs no Python fork hook)."""
    new_snapshot_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        try:
            os.write(write, "".join(new_snapshot_id() for _ in range(3)).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        child = pipe.read()
    parent = "".join(new_snapshot_id() for _ in range(3))
    assert len(child) == len(parent) == 96 and child != parent
    assert not {child[i : i + 32] for i in (0, 32, 64)} & {parent[i : i + 32] for i in (0, 32, 64)}
