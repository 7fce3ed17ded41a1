"""Telling an infrastructure outage from a bug, and saying where an error arose.

An outage (a database, Redis or MongoDB server that does not answer) heals by
itself: whoever retries should retry often enough to notice the server's return
within seconds. A bug does not heal: its retries should back off.
"""

from __future__ import annotations

import os
import site
import sysconfig
from types import TracebackType

#: Exception class names (anywhere in the class's MRO) that mean "the server did not
#: answer": Django's and the drivers' (psycopg, MySQLdb, redis-py, pymongo, kombu).
OUTAGE_CLASS_NAMES = frozenset(
    {
        "OperationalError",
        "InterfaceError",
        "ConnectionError",
        "ConnectionFailure",
        "AutoReconnect",
        "ServerSelectionTimeoutError",
        "NetworkTimeout",
        "TimeoutError",
        "BusyLoadingError",
    }
)

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Where installed libraries and the standard library live.
_LIBRARY_DIRS = tuple(
    {
        os.path.abspath(path)
        for path in (
            sysconfig.get_paths()["stdlib"],
            sysconfig.get_paths()["purelib"],
            sysconfig.get_paths()["platlib"],
            *site.getsitepackages(),
        )
    }
)


def is_outage(exc: BaseException) -> bool:
    """Whether *exc* (or what caused it) says that a server did not answer."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError):
            return True
        if any(cls.__name__ in OUTAGE_CLASS_NAMES for cls in type(current).__mro__):
            return True
        current = current.__cause__ or current.__context__
    return False


def error_where(exc: BaseException) -> str:
    """The innermost function of this package or of the project (not of an installed
    library or the standard library) that *exc* passed through: a handler
    (``on_insert``) or a store method (``OrmCheckpointStore.save_processed``), or
    ``""``. Where it arose, without data."""
    where = ""
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if _is_own_code(os.path.abspath(code.co_filename)):
            name = getattr(code, "co_qualname", code.co_name)
            if "<locals>" not in name:  # a wrapper made on the fly says nothing
                where = name
        tb = tb.tb_next
    return where


def _is_own_code(path: str) -> bool:
    if path.startswith(_PACKAGE_DIR):
        return True
    return not any(path.startswith(prefix) for prefix in _LIBRARY_DIRS)


def short_message(exc: BaseException, most: int = 200) -> str:
    """The first line of *exc*'s message, at most *most* characters (pymongo's
    server-selection errors append a whole topology description)."""
    first = (str(exc).splitlines() or [""])[0].split(", Timeout:")[0]
    return first if len(first) <= most else first[: most - 1] + "…"


def error_summary(exc: BaseException | None) -> str:
    """``"OperationalError in OrmCheckpointStore.save_processed"``: the error's class
    and where it arose, never its message (which may quote event data)."""
    if exc is None:
        return ""
    where = error_where(exc)
    return f"{type(exc).__name__} in {where}" if where else type(exc).__name__
