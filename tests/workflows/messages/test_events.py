"""Events a run publishes (``ctx.set_event``), read with ``Workflow.get_event`` and
``aget_event``, on SQLite, PostgreSQL and MariaDB: the latest value wins, a reader waits up
to its timeout for one, and ``None`` when none came."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from flowwarden_django.common.user_input import UserJSONError
from flowwarden_django.models import WorkflowEvent
from flowwarden_django.workflows import (
    StepContext,
    Workflow,
    WorkflowDefinition,
    done,
    step,
    wait_for,
)
from flowwarden_django.workflows.waiting.messages import get_event, set_event
from tests.support.messages import EVERY_DATABASE, new_cid

pytestmark = pytest.mark.django_db(transaction=True)

Define = Callable[..., WorkflowDefinition]


@step("start")
def start(state: dict[str, Any], ctx: StepContext) -> Any:
    ctx.set_event("progress", {"stage": "started"})
    ctx.set_event("progress", {"stage": "waiting"})  # the latest value wins
    return wait_for(state, "go")


@step("finish")
def finish(state: dict[str, Any], ctx: StepContext) -> Any:
    assert ctx.message is not None
    ctx.set_event("result", ctx.message.payload)
    ctx.set_event("nothing", None)
    return done(state)


@EVERY_DATABASE
def test_get_event_sees_a_steps_event_and_the_latest_value(alias: str, define: Define):
    flow = define([start, finish])
    cid = new_cid()
    flow.start({}, coordination_id=cid)
    wf = Workflow.for_coordination(cid, using=alias)
    assert wf.get_event("progress") == {"stage": "waiting"}
    assert wf.get_event("result") is None  # not set: None at once
    assert wf.get_event("result", timeout=0.05) is None  # nor after a short wait

    wf.send("go", {"total": 3})
    assert wf.get_event("result") == {"total": 3}
    assert wf.get_event("nothing", timeout=5) is None  # set to null: no wait
    assert WorkflowEvent.objects.using(alias).filter(coordination_id=cid).count() == 3
    other = new_cid()
    assert get_event(other, "progress", using=alias) is None  # per run


@EVERY_DATABASE
def test_get_event_waits_for_a_value_set_meanwhile(alias: str, define: Define):
    flow = define([start, finish])
    cid = new_cid()
    flow.start({}, coordination_id=cid)
    wf = Workflow.for_coordination(cid, using=alias)
    got: list[Any] = []
    reading = threading.Event()

    def reader() -> None:
        try:
            reading.set()
            got.append(wf.get_event("result", timeout=60))
        finally:
            connections.close_all()

    thread = threading.Thread(target=reader)
    thread.start()
    assert reading.wait(30)
    wf.send("go", {"total": 7})
    thread.join(90)
    assert not thread.is_alive()
    assert got == [{"total": 7}]


@EVERY_DATABASE
@pytest.mark.anyio
async def test_aget_event_is_get_event_from_async_code(alias: str, define: Define):
    flow = define([start, finish])
    cid = new_cid()
    await flow.astart({}, coordination_id=cid)
    wf = await sync_to_async(Workflow.for_coordination, thread_sensitive=True)(cid, using=alias)
    try:
        assert await wf.aget_event("progress") == {"stage": "waiting"}
        waiting = asyncio.ensure_future(wf.aget_event("result", timeout=60))
        await asyncio.sleep(0)
        await wf.asend("go", {"total": 2})
        assert await waiting == {"total": 2}
        assert await wf.aget_event("missing", timeout=0.05) is None
    finally:
        await sync_to_async(connections.close_all, thread_sensitive=True)()


@EVERY_DATABASE
def test_an_event_is_checked_by_the_validator(alias: str):
    cid = new_cid()
    with pytest.raises(UserJSONError, match="the event value holds a NUL character"):
        set_event(cid, "k", {"a": "\x00"}, using=alias)
    with pytest.raises(UserJSONError, match="the event key must not be blank"):
        set_event(cid, " ", 1, using=alias)
    with pytest.raises(ValueError, match="timeout must be seconds"):
        get_event(cid, "k", timeout=-1, using=alias)
    set_event(cid, "k", [1, "two", None], using=alias)
    assert get_event(cid, "k", using=alias) == [1, "two", None]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
