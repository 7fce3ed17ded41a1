"""What a send refuses, on SQLite and PostgreSQL: an unknown, completed or cancelled
run, and arguments the core's validator refuses (the same errors through
``Workflow.send``, ``send_message`` and ``ctx.send``), with nothing stored; and
``ctx.send``, whose keys make a step's sends happen once across its retries and its
runs again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from flowwarden_django.common.user_input import MAX_PAYLOAD_BYTES, UserJSONError
from flowwarden_django.models import WorkflowMessage
from flowwarden_django.workflows import (
    Completed,
    RunCancelledError,
    RunFinishedError,
    RunStatus,
    StepContext,
    UnknownRunError,
    Workflow,
    WorkflowDefinition,
    advance,
    done,
    fail,
    hibernate,
    send_message,
    step,
    wait_for,
)
from flowwarden_django.workflows.waiting.messages.sending import step_message_key
from tests.support.messages import ALIASES, mailbox, new_cid, run_of

pytestmark = pytest.mark.django_db(transaction=True)

Define = Callable[..., WorkflowDefinition]


@step("pause")
def pause(state: dict[str, Any]) -> Any:
    return hibernate(state)


@step("finish")
def finish(state: dict[str, Any]) -> Any:
    return done(state)


def deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


#: (payload, the ``UserJSONError`` code) of payloads every path refuses.
HOSTILE = [
    pytest.param({"note": "a\x00b"}, "json_bad_text", id="nul"),
    pytest.param({"a\x00": 1}, "json_bad_text", id="nul-key"),
    pytest.param({"s": "\ud800"}, "json_bad_text", id="surrogate"),
    pytest.param(deep(65), "json_too_deep", id="too-deep"),
    pytest.param({"blob": "x" * MAX_PAYLOAD_BYTES}, "json_too_large", id="too-big"),
    pytest.param({"n": float("nan")}, "json_not_finite", id="nan"),
    pytest.param({"o": object()}, "json_invalid", id="not-json"),
    pytest.param([1, 2], "json_not_object", id="a-list"),
    pytest.param("paid", "json_not_object", id="a-string"),
    pytest.param(None, "json_not_object", id="null"),
]


@ALIASES
@pytest.mark.parametrize(("payload", "code"), HOSTILE)
def test_hostile_payloads_are_refused_the_same_way_everywhere_and_nothing_is_stored(
    alias: str, define: Define, payload: Any, code: str
):
    orders = define([pause, finish])
    cid = new_cid()
    orders.start({}, coordination_id=cid)
    wf = Workflow.for_coordination(cid, using=alias)
    errors = []
    for send in (
        lambda: wf.send("payment", payload),
        lambda: send_message(cid, "payment", payload, using=alias),
        lambda: StepContext(cid, orders.name, "pause", outbox=outbox_of(cid, alias)).send(
            cid, "payment", payload
        ),
    ):
        with pytest.raises(UserJSONError) as raised:
            send()
        errors.append((raised.value.code, str(raised.value)))
    assert errors[0][0] == code
    assert errors == [errors[0]] * 3
    assert "the message payload" in errors[0][1]
    assert mailbox(alias, cid) == []


def outbox_of(cid: str, alias: str) -> Any:
    from flowwarden_django.workflows.waiting.messages.sending import AttemptOutbox

    return AttemptOutbox(cid, "0" * 32, "pause", alias)


@ALIASES
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"topic": ""}, "the topic must not be blank"),
        ({"topic": "x" * 256}, "the topic is 256 characters; the most is 255"),
        ({"topic": "pay\x00"}, "the topic holds a NUL character"),
        ({"topic": 7}, "the topic must be text"),
        ({"idempotency_key": ""}, "the idempotency key must not be blank"),
        ({"idempotency_key": "k" * 256}, "the idempotency key is 256 characters"),
        ({"sender": "me\x00"}, "the sender holds a NUL character"),
    ],
)
def test_a_bad_topic_key_or_sender_is_refused(
    alias: str, define: Define, arguments: dict[str, Any], message: str
):
    orders = define([pause, finish])
    cid = new_cid()
    orders.start({}, coordination_id=cid)
    wf = Workflow.for_coordination(cid, using=alias)
    call = {"topic": "payment", "payload": {"ok": True}, **arguments}
    with pytest.raises(UserJSONError, match=message):
        wf.send(**call)
    assert mailbox(alias, cid) == []


@ALIASES
def test_a_send_to_an_unknown_completed_or_cancelled_run_is_refused(alias: str, define: Define):
    with pytest.raises(UnknownRunError, match="no workflow run 'nobody'"):
        send_message("nobody", "payment", {"amount": 1}, using=alias)
    with pytest.raises(LookupError):
        Workflow.for_coordination("nobody", using=alias)

    orders = define([pause, finish])
    done_cid, cancelled_cid, failed_cid = new_cid(), new_cid(), new_cid()
    for cid in (done_cid, cancelled_cid, failed_cid):
        orders.start({}, coordination_id=cid)
    completed = Workflow.for_coordination(done_cid, using=alias)
    assert completed.run() == Completed({}, done_cid)
    with pytest.raises(RunFinishedError) as finished:
        completed.send("payment", {"amount": 1})
    assert (finished.value.code, finished.value.status) == ("run_finished", "completed")
    assert not isinstance(finished.value, RunCancelledError)

    cancelled = Workflow.for_coordination(cancelled_cid, using=alias)
    cancelled.cancel("no longer needed")
    with pytest.raises(RunCancelledError) as refused:
        cancelled.send("payment", {"amount": 1})
    assert (refused.value.code, refused.value.status) == ("run_cancelled", "cancelled")
    assert isinstance(refused.value, RunFinishedError)

    # A failed run may run again: it takes messages.
    WorkflowRun = run_of(alias, failed_cid).__class__
    WorkflowRun.objects.using(alias).filter(pk=failed_cid).update(status=RunStatus.FAILED)
    Workflow.for_coordination(failed_cid, using=alias).send("payment", {"amount": 1})
    assert (
        not WorkflowMessage.objects.using(alias)
        .filter(coordination_id__in=[done_cid, cancelled_cid])
        .exists()
    )
    assert len(mailbox(alias, failed_cid)) == 1


@ALIASES
def test_ctx_send_happens_once_across_retries_and_runs_of_the_step_again(
    alias: str, define: Define
):
    receiver = define([wait_step("first"), wait_step("second"), collect])
    target = new_cid()
    receiver.start({}, coordination_id=target)

    tries: list[int] = []

    @step("notify", max_retries=1, retry_delay=0)
    def notify(state: dict[str, Any], ctx: StepContext) -> Any:
        tries.append(ctx.attempt)
        ctx.send(target, "note", {"n": 1})
        ctx.send(target, "note", {"n": 2})
        if len(tries) == 1:
            raise RuntimeError("a retry")  # the retry sends the same two keys
        if len(tries) == 2:
            return fail("then the run fails")  # and a run again sends them again
        return advance(state)

    sender = define([notify])
    cid = new_cid()
    assert sender.start({}, coordination_id=cid).result.status == RunStatus.FAILED
    assert Workflow.for_coordination(cid, using=alias).run() == Completed({}, cid)
    assert tries == [1, 2, 1]
    rows = mailbox(alias, target)
    assert [row.payload for row in rows] == [{"n": 1}, {"n": 2}]
    assert {row.sender for row in rows} == {cid}
    head = Workflow.for_coordination(cid, using=alias).history()[0].id
    assert [row.idempotency_key for row in rows] == [
        step_message_key(head, "notify", 1),
        step_message_key(head, "notify", 2),
    ]
    assert Workflow.for_coordination(target, using=alias).current_result() == Completed(
        {"notes": [{"n": 1}, {"n": 2}]}, target
    )


def wait_step(name: str) -> Any:
    @step(name)
    def run(state: dict[str, Any], ctx: StepContext) -> Any:
        notes = state.get("notes", [])
        if ctx.message is not None:
            notes = [*notes, ctx.message.payload]
        return wait_for({**state, "notes": notes}, "note")

    return run


@step("collect")
def collect(state: dict[str, Any], ctx: StepContext) -> Any:
    assert ctx.message is not None
    return done({**state, "notes": [*state["notes"], ctx.message.payload]})


def test_a_long_step_name_makes_a_key_of_at_most_255_characters() -> None:
    key = step_message_key("f" * 32, "s" * 255, 3)
    assert len(key) <= 255 and key.startswith("step:" + "f" * 32 + ":3:")
    assert key == step_message_key("f" * 32, "s" * 255, 3)
    assert step_message_key("f" * 32, "short", 1) == f"step:{'f' * 32}:1:short"


def test_ctx_send_outside_a_run_says_what_it_needs() -> None:
    ctx = StepContext("test", "test", "step")
    with pytest.raises(RuntimeError, match=r"ctx.send\(\) works in a step of a running workflow"):
        ctx.send("other", "topic", {})
    with pytest.raises(RuntimeError, match=r"ctx.set_event\(\)"):
        ctx.set_event("key", 1)
    assert ctx.message is None
