"""The progress bar of ``flowwarden_streams resync --wait``: the copy's own rate, and
its last line once."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management.base import BaseCommand, OutputWrapper
from django.utils import timezone

from flowwarden_django.management.copy_watch import CopyWatch
from flowwarden_django.streams.initial_sync.progress import COPYING, DONE, CopyProgress

pytest.importorskip("tqdm")


def test_the_bar_shows_the_copy_s_rate_and_its_last_line_once():
    out = io.StringIO()
    command = BaseCommand(stdout=out)
    command.stdout = OutputWrapper(out)
    watch = CopyWatch(command, "orders", store=None, after_batch=0)  # type: ignore[arg-type]
    started = timezone.now() - timedelta(seconds=10)

    def progress(phase: str, copied: int) -> CopyProgress:
        at = started + timedelta(seconds=copied / 1000)
        done = at if phase == DONE else None
        return CopyProgress(phase, "first start", copied, 10_000, started, at, done)

    # The command starts when the copy is nearly done: tqdm's own rate would be
    # thousands of documents in a few milliseconds.
    watch._draw(progress(COPYING, 9_000))
    watch._draw(progress(DONE, 10_000))
    watch._bar.close()
    lines = [line for line in out.getvalue().replace("\r", "\n").splitlines() if line.strip()]
    assert "1,000 docs/s" in lines[-1] and "100%" in lines[-1]
    assert sum("100%" in line for line in lines) == 1, lines
