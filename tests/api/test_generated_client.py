"""A client generated from the served schema works as generated: openapi-python-client
(offline, from the schema file) writes it, every module imports unedited, and it
talks to a live server: a token, ``mine``, an approval, a message and a run's mailbox,
a cancelled run."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from flowwarden_django.models import Approval, WorkflowRun
from flowwarden_django.workflows import Workflow
from tests.api.helpers import API, make_people, pending, perms
from tests.support.refund_workflow import seen_decisions

pytest.importorskip("openapi_python_client")

pytest_plugins = ["tests.api.helpers"]  # the refunds fixture
pytestmark = [pytest.mark.subprocess, pytest.mark.django_db(transaction=True)]

#: The generated package's name (unique: it is imported into this process).
PACKAGE = "flowwarden_generated_client"


def generate(schema: dict[str, Any], where: Path) -> None:
    """Run openapi-python-client on *schema*: no formatter hooks (nothing but the
    generator runs), and any warning fails (a piece it could not generate)."""
    (where / "schema.json").write_text(json.dumps(schema))
    (where / "config.yaml").write_text("post_hooks: []\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "openapi_python_client",
            "generate",
            "--path",
            str(where / "schema.json"),
            "--config",
            str(where / "config.yaml"),
            "--meta",
            "none",
            "--output-path",
            str(where / PACKAGE),
            "--fail-on-warning",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def generated(tmp_path: Path) -> Iterator[Any]:
    """The client generated from the served schema, imported (every module of it)."""
    schema = Client().get(f"{API}/schema/?format=json").json()
    generate(schema, tmp_path)
    sys.path.insert(0, str(tmp_path))
    try:
        package = importlib.import_module(PACKAGE)
        for module in pkgutil.walk_packages(package.__path__, f"{PACKAGE}."):
            importlib.import_module(module.name)
        yield package
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


def part(name: str) -> Any:
    return importlib.import_module(f"{PACKAGE}.{name}")


def test_a_generated_client_works_unedited(generated: Any, live_server: Any, refunds: Any) -> None:
    people = make_people()
    perms(people.alice, "cancel_workflowrun", "send_message_workflowrun")
    to_approve = pending(refunds, amount=250)
    to_cancel = pending(refunds, amount=300)
    models = part("models")

    # A token for a username and password: the request model asks for no `token`.
    anonymous = generated.Client(base_url=live_server.url, raise_on_unexpected_status=True)
    token = part("api.token.token_create").sync(
        client=anonymous, body=models.AuthTokenRequest(username="alice", password="pw")
    )
    assert isinstance(token, models.Token) and token.token
    alice = generated.AuthenticatedClient(
        base_url=live_server.url, token=token.token, prefix="Token"
    )

    # `mine`: both pending approvals, as typed models.
    mine = part("api.approvals.approvals_mine").sync(client=alice)
    assert isinstance(mine, models.PaginatedApprovalList)
    assert {str(a.id) for a in mine.results} == {str(to_approve.pk), str(to_cancel.pk)}
    assert all(a.status == models.ApprovalStatusEnum.PENDING for a in mine.results)

    # Approve one, with a comment and a payload: the run goes on with them.
    payload = models.DecisionRequestPayloadType0.from_dict({"ticket": 7})
    decided = part("api.approvals.approvals_approve").sync(
        id=to_approve.pk,
        client=alice,
        body=models.DecisionRequest(comment="fine", payload=payload),
    )
    assert isinstance(decided, models.ApprovalDecided), decided
    assert decided.status == models.ApprovalStatusEnum.APPROVED
    assert Approval.objects.get(pk=to_approve.pk).decided_by == "alice"
    assert WorkflowRun.objects.get(pk=to_approve.coordination_id).status == "completed"
    assert seen_decisions[-1].payload == {"ticket": 7}

    # A message to the other run (it waits for an approval: the message is kept), and
    # its mailbox.
    message = models.SendMessageRequest(
        topic="note",
        payload=models.SendMessageRequestPayload.from_dict({"text": "call back"}),
        idempotency_key="crm-1",
    )
    sent = part("api.runs.runs_messages_create").sync_detailed(
        coordination_id=to_cancel.coordination_id, client=alice, body=message
    )
    assert sent.status_code == 201 and isinstance(sent.parsed, models.Message), sent
    assert (sent.parsed.sender, sent.parsed.payload.to_dict()) == (
        "user:alice",
        {"text": "call back"},
    )
    mailbox = part("api.runs.runs_messages_list").sync(
        coordination_id=to_cancel.coordination_id, client=alice
    )
    assert isinstance(mailbox, models.PaginatedMailboxMessageList)
    assert [(m.topic, m.delivered_to) for m in mailbox.results] == [("note", None)]

    # Cancel the other run.
    cancelled = part("api.runs.runs_cancel").sync(
        coordination_id=to_cancel.coordination_id,
        client=alice,
        body=models.CancelRequest(reason="customer withdrew"),
    )
    assert isinstance(cancelled, models.RunDetail), cancelled
    assert cancelled.status == models.RunStatusEnum.CANCELLED
    assert WorkflowRun.objects.get(pk=to_cancel.coordination_id).status == "cancelled"
    assert Approval.objects.get(pk=to_cancel.pk).status == "cancelled"
    assert Workflow.for_coordination(to_cancel.coordination_id).history()

    # An error comes back as the API's error model, not an exception.
    again = part("api.runs.runs_cancel").sync_detailed(
        coordination_id=to_cancel.coordination_id,
        client=alice,
        body=models.CancelRequest(reason="twice"),
    )
    assert again.status_code == 409
    assert isinstance(again.parsed, models.Error) and again.parsed.code == "run_finished"
    refused = part("api.runs.runs_messages_create").sync_detailed(
        coordination_id=to_cancel.coordination_id,
        client=alice,
        body=models.SendMessageRequest(
            topic="note", payload=models.SendMessageRequestPayload.from_dict({})
        ),
    )
    assert refused.status_code == 409
    assert isinstance(refused.parsed, models.Error) and refused.parsed.code == "run_cancelled"
