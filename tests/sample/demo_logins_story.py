"""The child process of ``test_demo_logins.py``: the logins ``manage.py demo --serve``
makes, used as a person would, with Django's test client on the sample project's
settings (``DJANGO_SETTINGS_MODULE``, a migrated database).

``python -m tests.sample.demo_logins_story OUT.json`` writes what the approver and the
admin could do, and what ``--serve`` prints, to ``OUT.json`` for the test to judge.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import django

BASE = "http://127.0.0.1:8123"
ORDER = {"_id": 7, "customer": "acme", "total_cents": 250_000}


def story() -> dict[str, Any]:
    from django.contrib.auth.models import Permission, User
    from django.core.management.color import no_style
    from django.test import Client

    from flowwarden_django.models import Approval, WorkflowRun
    from sampleproject.shop.management.commands.demo import demo_login, serve_instructions
    from sampleproject.shop.workflows import idempotency_key, start_for_order

    seen: dict[str, Any] = {}
    # An approver left by an earlier demo, when the demo made it staff.
    earlier = User.objects.create_user("approver", is_staff=True)
    earlier.user_permissions.add(Permission.objects.get(codename="view_deadletter"))

    approver_password = demo_login("approver")
    admin_password = demo_login("admin", superuser=True)
    approver = User.objects.get(username="approver")
    seen["approver"] = {
        "is_staff": approver.is_staff,
        "is_superuser": approver.is_superuser,
        "groups": sorted(approver.groups.values_list("name", flat=True)),
        "permissions": approver.user_permissions.count(),
    }
    seen["admin_is_staff"] = User.objects.get(username="admin").is_staff

    start_for_order(ORDER)
    run = WorkflowRun.objects.get(idempotency_key=idempotency_key(ORDER["_id"]))
    approval = Approval.objects.get(coordination_id=run.pk)
    seen["run_before"] = run.status

    person = Client()
    login = person.post(
        "/approvals/login/",
        {"username": "approver", "password": approver_password, "next": "/approvals/"},
        follow=True,
    )
    inbox = login.content.decode()
    seen["inbox"] = {
        "status": login.status_code,
        "lists_the_approval": f"/approvals/{approval.pk}/" in inbox,
    }
    seen["admin_for_the_approver"] = person.get("/admin/").status_code
    # The sample's approval has a decision form: without its fields, the page shows
    # the form's errors and nothing is decided; with them, it approves.
    refused = person.post(f"/approvals/{approval.pk}/", {"approve": "Approve", "comment": "ok"})
    seen["form_refused"] = {
        "status": refused.status_code,
        "shows_errors": "This field is required." in refused.content.decode(),
        "approval": Approval.objects.get(pk=approval.pk).status,
    }
    form = {"form-approved_amount": "2500.00", "form-reason": "credit_checked"}
    decided = person.post(
        f"/approvals/{approval.pk}/",
        {"approve": "Approve", "comment": "ok", **form},
        follow=True,
    )
    seen["decided_status"] = decided.status_code
    approval.refresh_from_db()
    run.refresh_from_db()
    seen["approval"] = {"status": approval.status, "decided_by": approval.decider}
    seen["run_after"] = run.status

    operator = Client()
    seen["admin_login"] = operator.login(username="admin", password=admin_password)
    seen["console_for_the_admin"] = operator.get(
        "/admin/flowwarden_django/streamworker/"
    ).status_code

    seen["printout"] = serve_instructions(
        BASE,
        admin_password=admin_password,
        approver_password=approver_password,
        next_id=1000,
        hold_until=datetime(2030, 1, 1, 12, 0, tzinfo=UTC),
        style=no_style(),
    )
    return seen


def main(out: Path) -> None:
    django.setup()
    from django.test.utils import setup_test_environment

    setup_test_environment()  # the test client's "testserver" host is allowed
    out.write_text(json.dumps(story()))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
