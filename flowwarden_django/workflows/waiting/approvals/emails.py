"""The email of an approval notification (``FLOWWARDEN["APPROVAL_EMAILS"]``).

The setting is ``None``/``False`` (the default: no email), ``True`` (emails with the
defaults below) or a dict of ``FROM_EMAIL`` (default: Django's
``DEFAULT_FROM_EMAIL``), ``BASE_URL`` (``"https://ops.example.com"``, put before the
link's path; default: none, a bare path), ``URL_NAME`` (the approval page's URL name,
reversed with ``pk``; default ``"flowwarden-inbox:approval"``) and ``SUBJECT_PREFIX``
(default ``"[flowwarden] "``). Recipients are the active users among the notification's
usernames and its group's members (``get_user_model()``) that have an email address;
each gets a message of their own, through Django's email backend.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.core.mail import EmailMessage
from django.db.models import Q
from django.urls import NoReverseMatch, reverse

from ....conf import fw_settings

if TYPE_CHECKING:
    from ....models import ApprovalNotification

logger = logging.getLogger("flowwarden_django.workflows")

#: The keys of ``FLOWWARDEN["APPROVAL_EMAILS"]`` as a dict.
EMAIL_KEYS = ("FROM_EMAIL", "BASE_URL", "URL_NAME", "SUBJECT_PREFIX")
DEFAULT_URL_NAME = "flowwarden-inbox:approval"
DEFAULT_SUBJECT_PREFIX = "[flowwarden] "
TITLES = {
    "requested": "Approval requested",
    "assigned": "Approval assigned to you",
    "reminded": "Reminder: approval waiting",
    "escalated": "Approval escalated",
}


def valid_email_setting(value: Any) -> bool:
    """Whether *value* is a valid ``APPROVAL_EMAILS`` (see the module docstring)."""
    if value is None or isinstance(value, bool):
        return True
    if not isinstance(value, Mapping) or not set(value) <= set(EMAIL_KEYS):
        return False
    for key, item in value.items():
        if not isinstance(item, str) or len(item) > 500 or "\x00" in item:
            return False
        if key != "SUBJECT_PREFIX" and not item.strip():
            return False
        if key == "SUBJECT_PREFIX" and ("\n" in item or "\r" in item):
            return False
    base = value.get("BASE_URL")
    return base is None or base.startswith(("http://", "https://"))


def _options() -> dict[str, Any]:
    value = fw_settings.APPROVAL_EMAILS
    return dict(value) if isinstance(value, Mapping) else {}


def emails_enabled() -> bool:
    """Whether ``FLOWWARDEN["APPROVAL_EMAILS"]`` is on."""
    return bool(fw_settings.APPROVAL_EMAILS)


def approval_link(approval_id: Any) -> str:
    """The URL of the approval's inbox page (``BASE_URL`` + the reversed path), or ""
    when the URL name is not routed."""
    options = _options()
    try:
        path = reverse(options.get("URL_NAME", DEFAULT_URL_NAME), kwargs={"pk": approval_id})
    except (NoReverseMatch, ImproperlyConfigured, AttributeError, ImportError):
        # Not routed here (a worker's settings without the inbox's URLs, say).
        logger.debug("no link to approval %s: its page is not routed", approval_id)
        return ""
    return options.get("BASE_URL", "").rstrip("/") + path


def recipient_emails(recipients: list[dict[str, str]]) -> list[str]:
    """The email addresses of the active users named (``{"user": ...}``) or in the
    groups named (``{"group": ...}``) in *recipients*, without duplicates."""
    users = [r["user"] for r in recipients if isinstance(r, dict) and r.get("user")]
    groups = [r["group"] for r in recipients if isinstance(r, dict) and r.get("group")]
    if not users and not groups:
        return []
    from django.contrib.auth import get_user_model

    model = get_user_model()
    named = Q(**{f"{model.USERNAME_FIELD}__in": users}) | Q(groups__name__in=groups)
    rows = model._default_manager.filter(named, is_active=True).exclude(email="")
    emails: dict[str, str] = {}
    for email in rows.values_list("email", flat=True).order_by("email"):
        emails.setdefault(email.lower(), email)
    return list(emails.values())


def _one_line(text: str, most: int = 120) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= most else line[: most - 1] + "…"


def message_text(row: ApprovalNotification) -> tuple[str, str]:
    """The subject and body of *row*'s email."""
    approval = row.approval
    title = TITLES.get(row.event, row.event)
    if row.event == "reminded":
        title = f"{title} (reminder {row.number})"
    prefix = _options().get("SUBJECT_PREFIX", DEFAULT_SUBJECT_PREFIX)
    subject = _one_line(f"{prefix}{title}: {approval.prompt or approval.workflow_name}", 200)
    lines = [
        f"{title}.",
        "",
        f"Workflow: {approval.workflow_name} (run {approval.coordination_id})",
        f"Step: {approval.step_name}",
        f"Requested at: {approval.requested_at:%Y-%m-%d %H:%M %Z}",
    ]
    if approval.expires_at is not None:
        lines.append(f"Expires at: {approval.expires_at:%Y-%m-%d %H:%M %Z}")
    lines += ["", str(approval.prompt or "")]
    link = approval_link(approval.pk)
    if link:
        lines += ["", f"Open it: {link}"]
    return subject, "\n".join(lines) + "\n"


def send_emails(row: ApprovalNotification) -> int:
    """Email *row* to its recipients (one message each); how many were sent."""
    to = recipient_emails(row.recipients or [])
    if not to:
        return 0
    subject, body = message_text(row)
    sender = _options().get("FROM_EMAIL")  # None: DEFAULT_FROM_EMAIL
    # Each through Django's default backend (or mailer, on Django 6.1+): no explicit
    # connection, whose get_connection() Django 6.1 deprecates. Django 6.1 also warns,
    # at every send, about a project without MAILERS: that is the project's setting to
    # make, not this app's call to change, so it is not raised from here.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*will not have a default mailer")
        return sum(EmailMessage(subject, body, sender, [address]).send() for address in to)
