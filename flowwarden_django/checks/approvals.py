"""The check of pending approvals: E211 a typed approval's form no longer imports."""

from __future__ import annotations

from typing import Any

from django.core import checks

from .workflows import readable_runs_database

#: The most unloadable form paths reported (one message each).
MAX_REPORTED_FORMS = 20


@checks.register()
def check_approval_forms(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E211 for each distinct form path of pending approvals that does not load (it
    no longer imports, or is not a Django ``Form``): nobody can approve them. One
    query of the approval table (skipped while it cannot be read, and when the caller
    names the databases checks may read and the runs' database is not one of them)."""
    from django.db import DatabaseError

    from ..models import Approval
    from ..workflows.waiting.approvals.forms import ApprovalFormUnavailableError, load_form

    db = readable_runs_database(kwargs.get("databases"))
    if db is None:
        return []
    try:
        paths = list(
            Approval.objects.using(db)
            .filter(status=Approval.Status.PENDING)
            .exclude(form="")
            .values_list("form", flat=True)
            .distinct()
            .order_by("form")[: MAX_REPORTED_FORMS + 1]
        )
    except DatabaseError:
        return []
    messages: list[checks.CheckMessage] = []
    for path in paths[:MAX_REPORTED_FORMS]:
        try:
            load_form(path)
        except ApprovalFormUnavailableError as exc:
            messages.append(
                checks.Error(
                    f"Pending approvals have a decision form that does not load: {exc}. "
                    "Nobody can approve them (rejecting needs no form).",
                    hint="Restore the form class at that import path (keep a moved form "
                    "importable at its old path until its approvals are decided), or "
                    "reject or cancel those approvals.",
                    obj=path,
                    id="flowwarden_django.E211",
                )
            )
    return messages
