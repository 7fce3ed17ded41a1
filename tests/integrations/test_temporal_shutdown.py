"""The Temporal worker's shutdown when the SDK's own shutdown does not finish (the
server went away during it): steps in flight still finish first, then the worker
leaves after a short linger instead of waiting on the server."""

from __future__ import annotations

import asyncio
import threading

import pytest

pytest.importorskip("temporalio")

from flowwarden_django.integrations.temporal.shutdown import StepExecutor, shut_down


class StuckWorker:
    """A worker whose shutdown never completes, like the SDK's waiting on a dead server."""

    def __init__(self) -> None:
        self.asked = False

    async def shutdown(self) -> None:
        self.asked = True
        await asyncio.Event().wait()


class PromptWorker:
    """A worker whose shutdown completes at once."""

    async def shutdown(self) -> None:
        return None


def test_a_stuck_sdk_shutdown_is_left_after_the_linger_when_no_step_runs() -> None:
    worker, steps = StuckWorker(), StepExecutor(2)
    try:
        asyncio.run(asyncio.wait_for(shut_down(worker, steps, linger=0.2), 30))
    finally:
        steps.shutdown()
    assert worker.asked


def test_a_step_in_flight_finishes_before_the_worker_leaves() -> None:
    worker, steps = StuckWorker(), StepExecutor(2)
    release, finished = threading.Event(), threading.Event()

    def step() -> None:
        release.wait(30)
        finished.set()

    steps.submit(step)
    assert steps.in_flight == 1

    async def stop_then_release() -> None:
        leaving = asyncio.ensure_future(shut_down(worker, steps, linger=0.2))
        # Several lingers pass while the step runs: the worker does not leave.
        done, _ = await asyncio.wait({leaving}, timeout=1.0)
        assert not done
        release.set()
        await asyncio.wait_for(leaving, 30)

    try:
        asyncio.run(stop_then_release())
    finally:
        steps.shutdown()
    assert finished.is_set()
    assert steps.in_flight == 0


def test_a_prompt_shutdown_returns_at_once() -> None:
    steps = StepExecutor(1)
    try:
        asyncio.run(asyncio.wait_for(shut_down(PromptWorker(), steps, linger=60), 30))
    finally:
        steps.shutdown()
