"""The figures the fault tests measure: printed, and repeated in pytest's terminal
summary (``tests/faults/conftest.py``) so a run without ``-s`` shows them too (under
pytest-xdist, only ``-s`` shows them: each worker prints its own)."""

from __future__ import annotations

#: Every line reported in this session, in order.
LINES: list[str] = []


def report(line: str) -> None:
    """Print *line* and keep it for the terminal summary."""
    print(line, flush=True)
    LINES.append(line)
