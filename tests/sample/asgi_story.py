"""The child process of ``test_async_views.py``: the shop's async views through Django's
``AsyncClient``, in an event loop with no sync thread around it (as under an ASGI
server), on the database of ``DJANGO_SETTINGS_MODULE`` (migrated already).

``python -m tests.sample.asgi_story OUT.json`` writes what each request answered,
and what the database holds afterwards, to ``OUT.json`` for the test to judge. An
exception in a view (``SynchronousOnlyOperation``, say) is re-raised by the client
and fails this process.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import django

SMALL, LARGE, OLD, UNKNOWN = 1, 2, 3, 999


def prepare() -> dict[str, Any]:
    """The people (a clerk who may start workflows, a user with no permission, a
    viewer of every approval, an approver in ``approvers``) and three orders: small,
    large, and a large one the initial sync copied (it predates the app)."""
    from django.contrib.auth.models import Group, Permission, User

    from sampleproject.shop.models import Order
    from sampleproject.shop.workflows import APPROVAL_THRESHOLD_CENTS, APPROVERS_GROUP

    approvers, _ = Group.objects.get_or_create(name=APPROVERS_GROUP)
    clerk = User.objects.create_user("clerk", password="pw")
    clerk.user_permissions.add(Permission.objects.get(codename="start_order_workflow"))
    nobody = User.objects.create_user("nobody", password="pw")
    viewer = User.objects.create_user("viewer", password="pw")
    viewer.user_permissions.add(Permission.objects.get(codename="view_approval"))
    approver = User.objects.create_user("approver", password="pw")
    approver.groups.add(approvers)
    Order.objects.create(order_id=SMALL, customer="c1", total_cents=4_200)
    Order.objects.create(order_id=LARGE, customer="c2", total_cents=APPROVAL_THRESHOLD_CENTS * 3)
    Order.objects.create(
        order_id=OLD, customer="c3", total_cents=APPROVAL_THRESHOLD_CENTS * 2, copied=True
    )
    return {"clerk": clerk, "nobody": nobody, "viewer": viewer, "approver": approver}


#: (name, content type, body) of hostile decision bodies: each must be a 400, no 5xx.
HOSTILE_BODIES: list[tuple[str, str, bytes]] = [
    ("form comment with a NUL", "application/x-www-form-urlencoded", b"comment=a%00b"),
    ("JSON comment with a NUL", "application/json", b'{"comment": "\\u0000"}'),
    ("JSON comment with a lone surrogate", "application/json", b'{"comment": "\\ud800"}'),
    ("JSON 2000 deep", "application/json", b'{"a":' * 2000 + b"1" + b"}" * 2000),
    ("JSON array 100000 deep", "application/json", b"[" * 100_000 + b"]" * 100_000),
    ("JSON NaN", "application/json", b'{"comment": NaN}'),
    ("JSON not UTF-8", "application/json", b'{"comment": "\xff\xfe"}'),
    ("JSON not an object", "application/json", b'["a"]'),
    ("JSON comment not text", "application/json", b'{"comment": 5}'),
    ("JSON 20000-char comment", "application/json", b'{"comment": "' + b"c" * 20_000 + b'"}'),
    ("form 20000-char comment", "application/x-www-form-urlencoded", b"comment=" + b"c" * 20_000),
    ("JSON over 16 KiB", "application/json", b'{"x": "' + b"y" * 17_000 + b'"}'),
    ("malformed JSON", "application/json", b'{"comment": '),
]


async def answer(response: Any) -> dict[str, Any]:
    return {"status": response.status_code, "body": json.loads(response.content)}


async def story(people: dict[str, Any]) -> dict[str, Any]:
    from asgiref.sync import sync_to_async
    from django.db import connections
    from django.test import AsyncClient

    from flowwarden_django.models import WorkflowRun
    from flowwarden_django.workflows import Workflow

    seen: dict[str, Any] = {}
    anonymous, clerk, nobody, approver = AsyncClient(), AsyncClient(), AsyncClient(), AsyncClient()
    viewer = AsyncClient()
    await clerk.aforce_login(people["clerk"])
    await nobody.aforce_login(people["nobody"])
    await viewer.aforce_login(people["viewer"])
    await approver.aforce_login(people["approver"])

    async def post(client: AsyncClient, path: str, body: Any = None) -> dict[str, Any]:
        if body is None:
            return await answer(await client.post(path))
        return await answer(await client.post(path, body, content_type="application/json"))

    seen["anonymous"] = await post(anonymous, f"/shop/orders/{LARGE}/start/")
    seen["no_permission"] = await post(nobody, f"/shop/orders/{LARGE}/start/")
    seen["predates_app"] = await post(clerk, f"/shop/orders/{OLD}/start/")
    seen["huge_order_id"] = await post(clerk, f"/shop/orders/{2**70}/start/")
    seen["unknown_order"] = await post(clerk, f"/shop/orders/{UNKNOWN}/start/")
    seen["get"] = (await clerk.get(f"/shop/orders/{LARGE}/start/")).status_code
    seen["small"] = await post(clerk, f"/shop/orders/{SMALL}/start/")
    seen["large"] = await post(clerk, f"/shop/orders/{LARGE}/start/")
    seen["large_again"] = await post(clerk, f"/shop/orders/{LARGE}/start/")

    approval = seen["large"]["body"]["approval_id"]
    approve = f"/shop/approvals/{approval}/approve/"
    # The clerk cannot see the approval: 404, as for one that does not exist, and
    # no audit row; the viewer sees it but may not decide it: 403, audited.
    seen["before_refusals"] = await sync_to_async(table_counts)()
    seen["clerk_approves"] = await post(clerk, approve, {"comment": "me?"})
    seen["after_clerk"] = await sync_to_async(table_counts)()
    seen["viewer_approves"] = await post(viewer, approve, {"comment": "v" * 2000})
    seen["viewer_refusals"] = await sync_to_async(refusals)()
    seen["bad_body"] = await post(approver, approve, ["not", "an", "object"])
    seen["before_hostile"] = await sync_to_async(table_counts)()
    hostile = {}
    for name, content_type, body in HOSTILE_BODIES:
        response = await approver.post(approve, body, content_type=content_type)
        hostile[name] = {"status": response.status_code, "body": json.loads(response.content)}
    seen["hostile"] = hostile
    seen["after_hostile"] = await sync_to_async(table_counts)()
    # The large order's decision form: no payload, and one over the order's total,
    # are 400s with the form's field errors, and nothing is decided.
    seen["form_missing"] = await post(approver, approve, {"comment": "fine"})
    seen["form_too_much"] = await post(
        approver,
        approve,
        {"comment": "fine", "payload": {"approved_amount": "1e9", "reason": "nope"}},
    )
    seen["after_form"] = await sync_to_async(table_counts)()
    form = {"approved_amount": "2000", "reason": "known_customer"}
    seen["approved"] = await post(approver, approve, {"comment": "fine", "payload": form})
    seen["approved_again"] = await post(approver, approve)
    seen["rejected_late"] = await post(approver, f"/shop/approvals/{approval}/reject/")
    seen["unknown_approval"] = await post(
        approver, "/shop/approvals/00000000-0000-0000-0000-000000000000/approve/"
    )
    seen["large_after"] = await post(clerk, f"/shop/orders/{LARGE}/start/")

    cid = seen["large"]["body"]["coordination_id"]
    run = await WorkflowRun.objects.aget(pk=cid)
    orders = WorkflowRun.objects.filter(workflow_name="order-approval")
    seen["run"] = {"status": run.status, "runs": await orders.acount()}
    history = await sync_to_async(lambda: Workflow.for_coordination(cid).history())()
    seen["chain"] = [snapshot.metadata.get("workflow.lastStep") for snapshot in history]
    seen["final_state"] = history[-1].state
    await sync_to_async(connections.close_all)()
    return seen


def table_counts() -> dict[str, Any]:
    """What a refused input must leave as it was: the rows of the runs, approvals and
    their audit trail, and the pending approval's status."""
    from flowwarden_django.models import Approval, ApprovalEvent, WorkflowRun

    return {
        "runs": WorkflowRun.objects.filter(workflow_name="order-approval").count(),
        "approvals": sorted(Approval.objects.values_list("status", flat=True)),
        "events": ApprovalEvent.objects.count(),
    }


def refusals() -> list[dict[str, Any]]:
    """The ``refused`` audit events: who, why (the code), how much comment kept."""
    from flowwarden_django.models import ApprovalEvent

    events = ApprovalEvent.objects.filter(action="refused").order_by("at", "pk")
    return [
        {
            "actor": e.actor,
            "code": e.detail.split(":")[0],
            "comment_chars": len(e.comment),
            "payload": e.payload,
        }
        for e in events
    ]


def main(out: Path) -> None:
    django.setup()
    from django.db import connections
    from django.test.utils import setup_test_environment

    setup_test_environment()  # the test client's "testserver" host is allowed
    people = prepare()
    connections.close_all()
    out.write_text(json.dumps(asyncio.run(story(people))))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
