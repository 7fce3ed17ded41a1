"""Deprecated: the old path of ``flowwarden_django.streams.runtime.manager``
(until 0.3; see CHANGELOG.md)."""

from ..common.deprecation import moved_module

__getattr__ = moved_module(
    __name__,
    "flowwarden_django.streams.runtime.manager",
    # what the 0.1.0 manager held besides the manager: the source helpers
    elsewhere={
        "max_await_ms": "flowwarden_django.streams.clients",
        "pymongo_source": "flowwarden_django.streams.clients",
        "source_options": "flowwarden_django.streams.clients",
    },
)
