"""Waiting for another thread or process in a test: poll a condition to a deadline.

A fixed sleep followed by an assertion fails on a loaded machine (the other side did
not get the CPU in time). These helpers wait for the thing itself, as long as it
takes up to a generous deadline, and return as soon as it holds.
"""

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: How long a test waits for something another thread or process does promptly when
#: the machine is idle; generous, because nothing passes sooner by waiting less.
DEADLINE_SECONDS = 30.0


def wait_until(
    condition: Callable[[], Any],
    what: str,
    timeout: float = DEADLINE_SECONDS,
    interval: float = 0.01,
) -> Any:
    """Poll *condition* until it returns something truthy, and return that.

    Raises ``AssertionError`` naming *what* when *timeout* seconds pass first.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def poll(
    read: Callable[[], T],
    until: Callable[[T], bool],
    timeout: float = DEADLINE_SECONDS,
    interval: float = 0.01,
) -> T:
    """Call *read* until *until* holds for its value or *timeout* passes; the last value.

    For a wait whose outcome the caller asserts itself (the assertion then shows the
    value that was seen).
    """
    deadline = time.monotonic() + timeout
    value = read()
    while not until(value) and time.monotonic() <= deadline:
        time.sleep(interval)
        value = read()
    return value
