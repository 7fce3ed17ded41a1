"""This process's share of each queue: the steps it runs now, against the queue's
``worker_concurrency``. Process memory is right here: the limit is per process, and
a process that dies takes its count with it."""

from __future__ import annotations

import os
import threading
from collections import Counter

_lock = threading.Lock()
_running: Counter[str] = Counter()
_pid = os.getpid()


def enter(queue: str, limit: int | None) -> bool:
    """Count one more step of *queue* in this process, if *limit* allows; whether it did."""
    global _pid
    with _lock:
        if _pid != os.getpid():  # a forked child starts with none of its parent's
            _running.clear()
            _pid = os.getpid()
        if limit is not None and _running[queue] >= limit:
            return False
        _running[queue] += 1
        return True


def leave(queue: str) -> None:
    """One step of *queue* fewer in this process."""
    with _lock:
        if _running[queue] > 0:
            _running[queue] -= 1


def room(queue: str, limit: int | None) -> bool:
    """Whether this process may start another step of *queue* now."""
    with _lock:
        return limit is None or _running[queue] < limit


def running(queue: str) -> int:
    """Steps of *queue* this process runs now."""
    with _lock:
        return _running[queue]
