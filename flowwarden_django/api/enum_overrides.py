"""This API's enum names in its OpenAPI schema, whatever schema the process made before.

drf-spectacular reads ``ENUM_NAME_OVERRIDES`` once per language and keeps what it
read for the life of the process (tfranzel/drf-spectacular#1244), although each
``SpectacularAPIView`` may set its own (``custom_settings``). In a project that serves
its own schema too, whichever schema is made first would name the other's enums: this
API's run and approval statuses would become ``StatusD69Enum`` and the like after the
project's schema, and the project's schema would keep this API's overrides after this
one. :func:`own_enum_overrides` forgets what was read before and after this API's
schema is made.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from drf_spectacular import plumbing

#: One schema of this API at a time: forgetting the cache mid-way through another of
#: ours would only make it read the same overrides again, but two at once would each
#: forget what the other relies on reading once.
_generating = threading.Lock()


@contextmanager
def own_enum_overrides() -> Iterator[None]:
    """Make drf-spectacular read ``ENUM_NAME_OVERRIDES`` afresh inside the block (from
    the settings patched in it) and again after it. Without the cache this works
    around (a drf-spectacular release that fixed it), the block runs as it is."""
    # The cache sits on the per-language loader in recent releases, on the public
    # function itself in older ones.
    cached = getattr(plumbing, "_load_enum_name_overrides", plumbing.load_enum_name_overrides)
    forget = getattr(cached, "cache_clear", None)
    if forget is None:
        yield
        return
    with _generating:
        forget()
        try:
            yield
        finally:
            forget()
