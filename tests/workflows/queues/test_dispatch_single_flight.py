"""``dispatch_quietly`` runs one dispatch at a time per queue partition in a process:
a call that comes meanwhile makes the running one go round once more, and a failed
dispatch leaves the partition free for the next call."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from flowwarden_django.workflows.queues import dispatch as dispatching
from flowwarden_django.workflows.queues.settings import QueueConfig


def config(name: str) -> Any:
    return QueueConfig(name=name)


def test_calls_meanwhile_make_one_more_round_not_a_race(monkeypatch: pytest.MonkeyPatch) -> None:
    inside, release = threading.Event(), threading.Event()
    rounds: list[str] = []
    at_once = [0, 0]  # now, most

    def slow_dispatch(queue: Any, partition: str, using: str) -> None:
        at_once[0] += 1
        at_once[1] = max(at_once)
        rounds.append(queue.name)
        inside.set()
        release.wait(10)
        at_once[0] -= 1

    monkeypatch.setattr(dispatching, "dispatch", slow_dispatch)
    first = threading.Thread(target=dispatching.dispatch_quietly, args=(config("q"), "", "db"))
    first.start()
    assert inside.wait(10)
    for _ in range(5):  # each returns at once: the running call goes round for them
        dispatching.dispatch_quietly(config("q"), "", "db")
    release.set()
    first.join(10)
    assert rounds == ["q", "q"]  # the first round, then one more for the five
    assert at_once[1] == 1
    assert dispatching._dispatching == {}


def test_a_failed_dispatch_leaves_the_partition_to_the_next_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []

    def failing(queue: Any, partition: str, using: str) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("the database went away")

    monkeypatch.setattr(dispatching, "dispatch", failing)
    monkeypatch.setattr(dispatching, "discard_unusable_connections", lambda: None)
    dispatching.dispatch_quietly(config("q"), "", "db")  # logged, not raised
    dispatching.dispatch_quietly(config("q"), "", "db")
    assert calls == [1, 1]
    assert dispatching._dispatching == {}
