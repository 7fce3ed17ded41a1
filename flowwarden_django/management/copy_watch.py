"""Following a stream's initial sync from a management command, with a progress bar.

The copy runs in whichever process runs the stream; the command reads the progress
record from the checkpoint store (``Checkpoint.initial_sync``) every ``poll``
seconds and draws it with tqdm (a plain line every few seconds without tqdm). It
stops when the copy is done, when the stream crashes, or when no process runs the
stream any more.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ..streams.checkpoint import CheckpointStore
from ..streams.initial_sync.progress import DONE, CopyProgress, copy_progress
from ..streams.operations.status import CRASHED, StreamStatus, stream_status

#: Seconds between plain progress lines when tqdm is not installed.
PLAIN_LINE_EVERY = 5.0


class _CommandWriter:
    """A file for tqdm that writes through the command's stdout (no added newlines)."""

    def __init__(self, command: BaseCommand) -> None:
        self.command = command

    def write(self, text: str) -> None:
        self.command.stdout.write(text, ending="")

    def flush(self) -> None:
        self.command.stdout.flush()


@dataclass(eq=False)
class CopyWatch:
    """Follows one stream's copy until it is done (see the module docstring)."""

    command: BaseCommand
    name: str
    store: CheckpointStore
    _: KW_ONLY
    #: The request's batch number: a ``done`` record above it is this copy's end.
    after_batch: int
    poll: float = 0.5
    status_every: float = 5.0
    #: What reads the stream's status (default: ``stream_status`` of this process).
    status_of: Callable[[str], StreamStatus | None] | None = None
    _bar: Any = field(default=None, init=False, repr=False)
    _last_line: float = field(default=0.0, init=False, repr=False)

    def follow(self) -> CopyProgress:
        """Draw the progress until the copy is done; return its final progress."""
        last_status = time.monotonic()
        try:
            while True:
                progress, batch = self._read()
                if progress is not None:
                    self._draw(progress)
                    if progress.phase == DONE and batch > self.after_batch:
                        return progress
                if time.monotonic() - last_status >= self.status_every:
                    last_status = time.monotonic()
                    self._check_running()
                time.sleep(self.poll)
        finally:
            if self._bar is not None:
                self._bar.close()

    def _read(self) -> tuple[CopyProgress | None, int]:
        saved = self.store.find(self.name)
        record = saved.initial_sync if saved is not None else None
        if not record:
            return None, -1
        return copy_progress(record), int(record["batch"])

    def _check_running(self) -> None:
        status = (self.status_of or _status_of)(self.name)
        if status is None:
            return
        if status.state == CRASHED:
            raise CommandError(
                f"stream {self.name!r} crashed during the copy; see `manage.py "
                "flowwarden_streams status` and the process's log. Once it runs again, the "
                "copy continues after its last committed batch."
            )
        if not status.instances:
            raise CommandError(
                f"no process runs stream {self.name!r} any more; the copy continues after "
                "its last committed batch when one does."
            )

    def _draw(self, progress: CopyProgress) -> None:
        if progress.started_at is None:
            return  # not picked up yet
        try:
            from tqdm import tqdm
        except ImportError:
            now = time.monotonic()
            if now - self._last_line >= PLAIN_LINE_EVERY or progress.phase == DONE:
                self._last_line = now
                self.command.stdout.write(f"  {self.name}: {progress.summary()}")
            return
        if self._bar is None:
            self._bar = tqdm(
                total=progress.estimated,
                desc=f"{self.name} ({progress.reason})",
                unit=" docs",
                file=_CommandWriter(self.command),
                mininterval=0.5,
                dynamic_ncols=False,
                ncols=100,
                # The copy's own rate (from its progress record), not tqdm's: the bar
                # starts when this command does, which may be long after the copy did.
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{postfix}]",
            )
        if progress.estimated is not None and progress.copied > (self._bar.total or 0):
            self._bar.total = progress.copied  # the estimate was low
        self._bar.n = progress.copied
        rate = progress.rate
        self._bar.set_postfix_str(
            f"{rate:,.0f} docs/s" if rate is not None else "starting", refresh=False
        )
        if progress.phase != DONE:
            self._bar.refresh()  # the last line is drawn once, by close()


def _status_of(name: str) -> StreamStatus | None:
    return next((status for status in stream_status() if status.name == name), None)
