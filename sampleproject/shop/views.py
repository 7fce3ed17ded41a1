"""The shop's async views, served under ASGI (``sampleproject/asgi.py``).

* ``POST /shop/orders/<order_id>/start/`` starts the order's approval workflow with
  ``Workflow.astart`` (the key the ``orders`` stream uses, so at most one run per
  order): 201 when this call created the run, 200 with the existing run otherwise.
* ``POST /shop/approvals/<id>/approve/`` and ``.../reject/`` decide with
  ``aapprove`` / ``areject``, with an optional ``comment`` (a JSON body's or a form's)
  and, in a JSON body, the ``payload``: approving a large order takes its decision
  form's fields (``forms.OrderDecisionForm``), else a 400 with ``errors`` per field.

Both need a logged-in user (the session, with Django's CSRF token: these are the
shop's own pages' endpoints). Starting needs the ``shop.start_order_workflow``
permission, and an order the initial sync copied (it predates the app) starts none.
The body passes the core's validator (``flowwarden_django.common.user_input``), so a
NUL, a lone surrogate or deep JSON is a 400, never a 500. Errors are
``{"code", "detail"}`` with the REST API's statuses: 400, 401, 403 (may not start, or
may see the approval but not decide it: audited), 404 (no such order or approval, or
one the user may not see: not audited, so the answer tells nothing), 409 (decided,
cancelled, busy; an order that predates the app), 410 (expired). Reads use the
async ORM; the workflow calls run in Django's thread-sensitive executor, and with
the in-process provider the steps run there before the response (see the README's
"Async API").
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

from flowwarden_django.models import Approval
from flowwarden_django.workflows import (
    ApprovalError,
    ApprovalExpiredError,
    ApprovalFormError,
    ApprovalPermissionError,
    UnknownApprovalError,
    UserJSONError,
    Workflow,
    aapprove,
    areject,
    check_comment,
    parse_user_json,
    visible_approvals,
)

from .models import Order
from .workflows import WORKFLOW, idempotency_key, initial_state

#: Who may start an order's workflow by hand.
START_PERMISSION = "shop.start_order_workflow"
#: The largest order id the ``Order`` table holds (a 32-bit integer column).
MAX_ORDER_ID = 2**31 - 1
#: The largest decision body taken.
MAX_BODY_BYTES = 16 * 1024


def error(status: int, code: str, detail: str) -> JsonResponse:
    return JsonResponse({"code": code, "detail": detail}, status=status)


async def run_body(coordination_id: str, status: str, order_id: int) -> dict[str, Any]:
    """The run's status, its pending approval and the order's approval field."""
    pending = Approval.objects.filter(
        coordination_id=coordination_id, status=Approval.Status.PENDING
    )
    approval_id = await pending.values_list("pk", flat=True).afirst()
    order = await Order.objects.aget(order_id=order_id)
    return {
        "coordination_id": coordination_id,
        "status": status,
        "approval_id": None if approval_id is None else str(approval_id),
        "order_approval": order.approval,
    }


@require_POST
async def start_order_workflow(request: HttpRequest, order_id: int) -> JsonResponse:
    """Start order *order_id*'s approval workflow (see the module)."""
    user = await request.auser()
    if not user.is_authenticated:
        return error(401, "not_authenticated", "log in to start a workflow")
    if not await user.ahas_perm(START_PERMISSION):
        return error(403, "permission_denied", f"starting needs the {START_PERMISSION} permission")
    order = None
    if order_id <= MAX_ORDER_ID:  # larger ids are no order (and overflow the column)
        order = await Order.objects.filter(order_id=order_id).afirst()
    if order is None:
        return error(404, "not_found", f"no order {order_id}")
    if order.copied:
        return error(
            409,
            "order_predates_app",
            f"order {order_id} predates the app (the initial sync copied it): it starts no "
            "approval workflow",
        )
    doc = {"_id": order.order_id, "customer": order.customer, "total_cents": order.total_cents}
    started = await Workflow.astart(
        WORKFLOW, initial_state(doc), idempotency_key=idempotency_key(order.order_id)
    )
    body = await run_body(started.coordination_id, started.result.status, order.order_id)
    status = 201 if started.created else 200
    return JsonResponse({"created": started.created, **body}, status=status)


def decision_of(request: HttpRequest) -> tuple[str, Any]:
    """The decision's comment and payload: a JSON body's ``comment`` and ``payload``,
    or a form's ``comment`` (no payload), through the core's validator ("" and
    ``None`` without them); ``UserJSONError`` when it is not that."""
    if request.content_type != "application/json":
        return check_comment(request.POST.get("comment", "")), None
    body = parse_user_json(request.body or b"{}", what="the body", max_bytes=MAX_BODY_BYTES)
    if not isinstance(body, dict):
        raise UserJSONError(
            'the body is JSON {"comment": "...", "payload": {...}}, a form, or empty', "invalid"
        )
    return check_comment(body.get("comment", "")), body.get("payload")


async def may_see(user: Any, approval_id: Any) -> bool:
    """Whether *user* may see approval *approval_id* (``visible_approvals``)."""
    rows = await sync_to_async(visible_approvals)(user)
    return await rows.filter(pk=approval_id).aexists()


@require_POST
async def decide_order_approval(
    request: HttpRequest, approval_id: Any, decision: str
) -> JsonResponse:
    """Approve or reject (*decision*, from the URL) an order's approval."""
    user = await request.auser()
    if not user.is_authenticated:
        return error(401, "not_authenticated", "log in to decide")
    if not await may_see(user, approval_id):
        # The same answer as for an approval that does not exist, and no audit row:
        # nothing tells this user that it does.
        return error(404, UnknownApprovalError.code, f"no approval {str(approval_id)!r}")
    decide = aapprove if decision == "approve" else areject
    try:
        comment, payload = decision_of(request)
        result = await decide(approval_id, user, comment=comment, payload=payload)
    except ApprovalFormError as exc:  # the decision form refused the payload
        body = {"code": exc.code, "detail": str(exc), "errors": exc.errors}
        return JsonResponse(body, status=400)
    except UserJSONError as exc:
        return error(400, "invalid", str(exc))
    except UnknownApprovalError as exc:
        return error(404, exc.code, str(exc))
    except ApprovalPermissionError as exc:
        return error(403, exc.code, str(exc))
    except ApprovalExpiredError as exc:
        return error(410, exc.code, str(exc))
    except ApprovalError as exc:  # already decided, cancelled, the run busy
        return error(409, exc.code, str(exc))
    approval = result.approval
    run = result.run_result
    return JsonResponse(
        {
            "approval_id": str(approval.pk),
            "status": approval.status,
            "decided_by": approval.decided_by,
            "repeated": result.repeated,
            "run_status": None if run is None else run.status,
        }
    )
