"""What a worker's log file says of a partition: the first line, after the cut, that
says the worker noticed it (the Temporal and Celery runner tests)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime

#: A line's stamp: Python's ``asctime`` (local time), Celery's ``[asctime: ...``, or the
#: Temporal SDK core's ISO time in UTC (after a colour code).
STAMP = re.compile(r"^(?:\x1b\[\dm|\[)?(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[.,]\d+)(Z)?", re.ASCII)


def stamp_of(line: str) -> float | None:
    """The ``time.time()`` a log line is stamped with, if it has a stamp."""
    found = STAMP.match(line)
    if found is None:
        return None
    when = datetime.fromisoformat(found.group(1).replace(",", "."))
    if "T" in found.group(1):  # the SDK core's, in UTC
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def first_notice(log: str, since: float, notices: Sequence[str]) -> str:
    """``"<seconds> s (<notice>)"``: the first line stamped at *since* (a
    ``time.time()``) or later that holds one of *notices*; ``"nothing"`` if none."""
    for line in log.splitlines():
        stamp = stamp_of(line)
        if stamp is None or stamp < since:
            continue
        for notice in notices:
            if notice in line:
                return f"{stamp - since:.1f} s ({notice})"
    return "nothing"
