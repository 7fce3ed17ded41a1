"""Plain data: nested mappings and lists copied as ``dict`` and ``list`` (a BSON
decoder's or mockupdb's ``OrderedDict``, a caller's read-only mapping), leaves as they
are."""

from collections.abc import Mapping
from typing import Any


def plain(value: Any) -> Any:
    """*value* with every nested mapping a ``dict`` and every list a new ``list``."""
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value
