"""``manage.py flowwarden_workflows send`` and ``events`` (and what ``show`` says of a
run's messages), through ``call_command`` on SQLite: a message to a waiting run
wakes it, a repeated key sends nothing, and each refusal is a ``CommandError`` that
says what to do."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from flowwarden_django.models import WorkflowMessage, WorkflowRun
from flowwarden_django.workflows import (
    RunStatus,
    Workflow,
    WorkflowDefinition,
    workflow_registry,
)
from tests.support.payments_workflow import define_payments

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def payments() -> Iterator[WorkflowDefinition]:
    definition = define_payments("cmd-payments")
    yield definition
    workflow_registry.unregister("cmd-payments")


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("flowwarden_workflows", *args, stdout=out)
    return out.getvalue()


def waiting(payments: WorkflowDefinition, cid: str) -> str:
    payments.start({}, coordination_id=cid)
    assert WorkflowRun.objects.get(pk=cid).status == RunStatus.WAITING_MESSAGE
    return cid


def test_send_wakes_the_waiting_run_and_prints_the_message_id(payments: Any) -> None:
    cid = waiting(payments, "order:1")
    out = run("send", cid, "payment", "--payload", '{"amount": 42}', "--idempotency-key", "pi_1")
    row = WorkflowMessage.objects.get()
    assert f"Sent message {row.pk} on 'payment' to run 'order:1' (new)." in out
    assert f"The run took it (snapshot {row.delivered_to}); it is completed." in out
    assert row.sender.startswith("cli:") and len(row.sender) > len("cli:")
    assert Workflow.for_coordination(cid).current_result().final_state["paid"] == {"amount": 42}

    again = run("send", cid, "payment", "--payload", '{"amount": 1}', "--idempotency-key", "pi_1")
    assert f"Message {row.pk} on 'payment' was sent to run 'order:1' before" in again
    assert "nothing new was sent (not new)" in again
    assert WorkflowMessage.objects.count() == 1


def test_a_message_for_a_later_wait_stays_in_the_mailbox(payments: Any) -> None:
    cid = waiting(payments, "order-2")
    out = run("send", cid, "refund", "--payload", "{}", "--sender", "crm", "--database", "default")
    assert "(new)" in out
    assert "It waits in the run's mailbox until the run waits for 'refund'" in out
    assert "the run is waiting_message" in out
    assert WorkflowMessage.objects.get().sender == "crm"
    shown = run("show", cid)
    assert "a message on 'payment'" in shown
    assert "1 (1 pending)" in shown
    assert f"`manage.py flowwarden_workflows events {cid}`" in shown
    assert json.loads(run("show", cid, "--json"))["run"]["waiting_topic"] == "payment"


def test_a_message_to_a_run_of_a_workflow_not_defined_here_waits_for_its_workers(
    payments: Any,
) -> None:
    cid = waiting(payments, "order-3")
    workflow_registry.unregister("cmd-payments")
    out = run("send", cid, "payment", "--payload", '{"amount": 5}')
    assert "It is in the run's mailbox and the run waits for it" in out
    assert WorkflowRun.objects.get(pk=cid).status == RunStatus.WAITING_MESSAGE


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        pytest.param("{amount: 1}", "is not valid JSON", id="not-json"),
        pytest.param("[1, 2]", "must be a JSON object, not an array", id="a-list"),
        pytest.param("null", "must be a JSON object, not null", id="null"),
        pytest.param('{"a": "x\\u0000"}', "NUL", id="nul"),
        pytest.param("[" * 70 + "]" * 70, "nest", id="too-deep"),
        pytest.param(json.dumps({"b": "x" * 70_000}), "bytes; the most is", id="too-big"),
    ],
)
def test_a_bad_payload_is_refused_and_nothing_is_sent(
    payments: Any, payload: str, words: str
) -> None:
    cid = waiting(payments, "order-4")
    with pytest.raises(CommandError, match=words) as refused:
        run("send", cid, "payment", "--payload", payload)
    assert "--payload" in str(refused.value)
    assert not WorkflowMessage.objects.exists()


def test_a_list_payload_says_how_to_write_an_object(payments: Any) -> None:
    cid = waiting(payments, "order-5")
    with pytest.raises(CommandError) as refused:
        run("send", cid, "payment", "--payload", "[1]")
    assert "Give --payload a JSON object, for example --payload '{\"amount\": 42}'" in str(
        refused.value
    )


def test_a_blank_topic_is_refused(payments: Any) -> None:
    cid = waiting(payments, "order-6")
    with pytest.raises(CommandError, match="The topic must not be blank; nothing was sent"):
        run("send", cid, "  ", "--payload", "{}")


def test_an_unknown_finished_or_cancelled_run_is_refused(payments: Any) -> None:
    with pytest.raises(CommandError, match=r"No workflow run 'nope'; nothing was sent\. Run `"):
        run("send", "nope", "payment", "--payload", "{}")
    done = waiting(payments, "order-7")
    run("send", done, "payment", "--payload", '{"amount": 1}')
    with pytest.raises(CommandError, match="is completed: it never waits again") as finished:
        run("send", done, "payment", "--payload", "{}")
    assert f"`manage.py flowwarden_workflows show {done}`" in str(finished.value)
    cancelled = waiting(payments, "order-8")
    Workflow.for_coordination(cancelled).cancel("withdrawn")
    with pytest.raises(CommandError, match="is cancelled: it never runs another step"):
        run("send", cancelled, "payment", "--payload", "{}")
    assert WorkflowMessage.objects.count() == 1


def test_send_needs_a_payload() -> None:
    with pytest.raises(CommandError, match="--payload"):
        run("send", "order-9", "payment")


def test_events_lists_what_the_run_published(payments: Any) -> None:
    cid = waiting(payments, "order-10")
    out = run("events", cid)
    assert out.splitlines()[0].split() == ["KEY", "UPDATED", "VALUE"]
    assert "stage" in out and '{"waiting_for": "payment"}' in out
    run("send", cid, "payment", "--payload", '{"amount": 3}')
    listed = json.loads(run("events", cid, "--json"))
    assert [(e["key"], e["value"]) for e in listed] == [("stage", {"paid": 3})]
    assert listed[0]["updated_at"]
    quiet = WorkflowRun.objects.create(
        coordination_id="quiet",
        workflow_name="x",
        created_at=listed and WorkflowRun.objects.get(pk=cid).created_at,
        updated_at=WorkflowRun.objects.get(pk=cid).updated_at,
    )
    assert "has published no events" in run("events", quiet.pk)
    with pytest.raises(CommandError, match="No workflow run 'nope'"):
        run("events", "nope")


def test_resume_of_a_waiting_run_says_to_send_it_a_message(payments: Any) -> None:
    cid = waiting(payments, "order-11")
    out = run("resume", cid)
    assert "waits for a message on 'payment' after step 'await-payment'" in out
    assert f"`manage.py flowwarden_workflows send {cid} payment --payload '{{...}}'`" in out
    assert WorkflowRun.objects.get(pk=cid).status == RunStatus.WAITING_MESSAGE
