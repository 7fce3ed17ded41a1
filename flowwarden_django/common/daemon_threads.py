"""A background job on a daemon thread of its own, run from ``start`` until ``stop``:
the workflows' recovery sweep, the renewal of a Redis broker's visibility timeout."""

from __future__ import annotations

import threading


class DaemonThread:
    """Runs ``_work`` (a subclass's loop, which waits on the ``_stop`` event between
    rounds) on a daemon thread named *thread_name*, from :meth:`start` until
    :meth:`stop`."""

    #: How long ``stop`` waits for the thread to end, by default, in seconds.
    stop_timeout: float = 10.0

    def __init__(self, thread_name: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, name=thread_name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Ask the loop to end, and wait up to *timeout* seconds (``None``:
        ``stop_timeout``) for it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.stop_timeout if timeout is None else timeout)

    def _work(self) -> None:
        raise NotImplementedError
