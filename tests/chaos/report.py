"""The figures the chaos tests report: printed, and repeated in pytest's terminal
summary (``tests/chaos/conftest.py``) so they show in CI's output, where a passing
test's output is captured."""

from __future__ import annotations

#: Every line reported in this session, in order.
LINES: list[str] = []


def report(line: str) -> None:
    """Print *line* and keep it for the terminal summary."""
    print(line, flush=True)
    LINES.append(line)
