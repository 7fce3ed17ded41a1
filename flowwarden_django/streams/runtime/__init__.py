"""Running streams: the drivers of the consumer core and what supervises them.

``threaded`` (``StreamConsumer``, one thread a stream) and ``event_loop``
(``AsyncStreamConsumer``, many streams on one asyncio loop) perform what
``streams.core`` decides; ``policy`` writes the processed anchor and
``observed_store`` reports and fences each checkpoint write. ``manager`` and
``async_manager`` start, supervise and stop a process's streams, with ``leadership``
for ``SINGLE_LEADER`` leases (its lock-service calls on ``lease_calls``' thread).
"""

from ...common.deprecation import moved_module
from .threaded import HistoryLostError, StreamConsumer, StreamInvalidatedError, StreamState

#: What the 0.1.0 module ``streams/runtime.py`` held besides its consumer, now in the core.
__getattr__ = moved_module(
    __name__,
    None,
    {
        "UnhandledEventError": "flowwarden_django.streams.core.events",
        "FilterError": "flowwarden_django.streams.core.events",
        "DeadLetterWriteError": "flowwarden_django.streams.core.events",
        "OplogTooShortError": "flowwarden_django.streams.core.resume",
    },
)

__all__ = ["HistoryLostError", "StreamConsumer", "StreamInvalidatedError", "StreamState"]
