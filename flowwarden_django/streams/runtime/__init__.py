"""Running streams: the drivers of the consumer core and what supervises them.

``threaded`` (``StreamConsumer``, one thread a stream) and ``event_loop``
(``AsyncStreamConsumer``, many streams on one asyncio loop) perform what
``streams.core`` decides; ``policy`` writes the processed anchor and
``observed_store`` reports and fences each checkpoint write. ``manager`` and
``async_manager`` start, supervise and stop a process's streams, with ``leadership``
for ``SINGLE_LEADER`` leases.
"""

from .threaded import HistoryLostError, StreamConsumer, StreamInvalidatedError, StreamState

__all__ = ["HistoryLostError", "StreamConsumer", "StreamInvalidatedError", "StreamState"]
