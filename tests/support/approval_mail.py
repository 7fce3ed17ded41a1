"""What the reminder and notification tests share: the people of the reminding
approval, a real SMTP server (aiosmtpd) keeping what it receives, and the emails each
notification stands for, counted by (event#number, recipient)."""

from __future__ import annotations

import email
import email.header
import email.policy
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.contrib.auth.models import Group, User

from flowwarden_django.models import Approval, ApprovalNotification
from tests.support.services import free_port

#: Who gets the email of each event of the reminding approval (``people``).
DECIDERS = ["alice@example.com", "bob@example.com"]
MANAGERS = ["mike@example.com"]


def people(alias: str = "default") -> dict[str, User]:
    """alice (assignee), bob and carol (finance; carol has no email), mike (managers)."""
    finance = Group.objects.db_manager(alias).create(name="finance")
    managers = Group.objects.db_manager(alias).create(name="managers")
    made = {
        name: User.objects.db_manager(alias).create_user(name, email=address, password="pw")
        for name, address in [
            ("alice", "alice@example.com"),
            ("bob", "bob@example.com"),
            ("carol", ""),
            ("mike", "mike@example.com"),
        ]
    }
    made["bob"].groups.add(finance)
    made["carol"].groups.add(finance)
    made["mike"].groups.add(managers)
    return made


class Inbox:
    """An aiosmtpd handler keeping every message it receives."""

    def __init__(self) -> None:
        self.messages: list[tuple[list[str], str]] = []
        self.port = 0

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        content = envelope.content.decode("utf-8", "replace")
        self.messages.append((list(envelope.rcpt_tos), content))
        return "250 OK"

    def bodies(self) -> list[str]:
        """The text of every message received, decoded (Django 6 sends it
        quoted-printable or base64, where the raw message would not show a link)."""
        found = []
        for _, content in self.messages:
            message = email.message_from_string(content, policy=email.policy.default)
            part = message.get_body(("plain",)) or message
            found.append(part.get_content())
        return found

    def received(self) -> Counter[tuple[str, str]]:
        """(event#number, recipient) of every message received."""
        got: Counter[tuple[str, str]] = Counter()
        for rcpt_tos, content in self.messages:
            message = email.message_from_string(content)
            header = email.header.decode_header(message["Subject"])
            subject = str(email.header.make_header(header))
            for address in rcpt_tos:
                got[key_of(subject, address)] += 1
        return got


@contextmanager
def smtp_server() -> Iterator[Inbox]:
    """A real SMTP server on a free port of this worker's block."""
    from aiosmtpd.controller import Controller

    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    inbox.port = controller.port
    try:
        yield inbox
    finally:
        controller.stop()


def key_of(subject: str, address: str) -> tuple[str, str]:
    """(event#number, recipient) of an email with *subject* sent to *address*."""
    if "Reminder" in subject:
        number = subject.split("(reminder ")[1].split(")")[0]
        return (f"reminded#{number}", address)
    event = "escalated" if "escalated" in subject else "requested"
    return (f"{event}#0", address)


def expected_mails(approval: Approval, using: str = "default") -> Counter[tuple[str, str]]:
    """(event#number, recipient) of every email the approval's notifications stand for."""
    wanted: Counter[tuple[str, str]] = Counter()
    for row in ApprovalNotification.objects.using(using).filter(approval=approval):
        for address in MANAGERS if row.event == "escalated" else DECIDERS:
            wanted[(f"{row.event}#{row.number}", address)] += 1
    return wanted
