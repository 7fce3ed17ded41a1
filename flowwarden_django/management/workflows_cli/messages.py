"""``send`` and ``events``: a message to a run, and the values a run published."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError
from django.utils import timezone

from ...common.formatting import dump_json, format_table, timestamp_text
from ...common.user_input import MAX_PAYLOAD_BYTES, UserJSONError
from ...models import WorkflowEvent, WorkflowMessage
from ...workflows import RunCancelledError, RunFinishedError, UnknownRunError, send_message
from ...workflows.runs.records import RunRecords, RunStatus
from ..base import ActionCommand, os_user
from .inputs import parse_json
from .output import COMMAND, iso, state_text

#: The prefix of the sender of a message sent with this command and no ``--sender``.
CLI_SENDER = "cli:"
EVENT_HEADERS = ("KEY", "UPDATED", "VALUE")


class MessageActions(ActionCommand):
    """``send`` and ``events`` of ``manage.py flowwarden_workflows``."""

    def handle_send(
        self,
        *,
        coordination: str,
        topic: str,
        payload: str,
        idempotency_key: str | None,
        sender: str | None,
        database: str | None,
        **options: Any,
    ) -> None:
        value = parse_json("--payload", payload, MAX_PAYLOAD_BYTES)
        sender = f"{CLI_SENDER}{os_user()}" if sender is None else sender
        try:
            sent = send_message(
                coordination,
                topic,
                value,
                idempotency_key=idempotency_key,
                sender=sender,
                using=database,
            )
        except UserJSONError as exc:
            raise CommandError(_refused(exc)) from exc
        except UnknownRunError as exc:
            raise CommandError(
                f"No workflow run {coordination!r}; nothing was sent. "
                f"Run `{COMMAND} list` to see the runs."
            ) from exc
        except RunCancelledError as exc:
            raise CommandError(
                f"Run {coordination!r} is cancelled: it never runs another step, so it "
                "takes no messages; nothing was sent."
            ) from exc
        except RunFinishedError as exc:
            raise CommandError(
                f"Run {coordination!r} is {exc.status}: it never waits again, so it takes "
                f"no more messages; nothing was sent. `{COMMAND} show {coordination}` "
                "shows how it ended."
            ) from exc
        message = sent.message
        if sent.created:
            self.stdout.write(
                self.style.SUCCESS(
                    f"Sent message {message.id} on {message.topic!r} to run {coordination!r} (new)."
                )
            )
        else:
            self.stdout.write(
                f"Message {message.id} on {message.topic!r} was sent to run {coordination!r} "
                f"before with idempotency key {idempotency_key!r}: nothing new was sent (not "
                "new)."
            )
        self._report_delivery(coordination, message.id, message.topic, database)

    def _report_delivery(
        self, coordination: str, message_id: int, topic: str, database: str | None
    ) -> None:
        """Where the message stands now: taken by a wait of the run, or in its mailbox."""
        runs = RunRecords(database)
        row = WorkflowMessage.objects.using(runs.db).filter(pk=message_id).first()
        record = runs.get(coordination)
        status = record.status if record is not None else "gone"
        if row is not None and row.delivered_to:
            self.stdout.write(f"The run took it (snapshot {row.delivered_to}); it is {status}.")
        elif (
            record is not None
            and record.status == RunStatus.WAITING_MESSAGE
            and (record.waiting_topic == topic)
        ):
            self.stdout.write(
                "It is in the run's mailbox and the run waits for it: a process that defines "
                "its workflow continues it (a worker, or the recovery sweep)."
            )
        else:
            self.stdout.write(
                f"It waits in the run's mailbox until the run waits for {topic!r} "
                f"(wait_for); the run is {status}."
            )

    def handle_events(
        self, *, coordination: str, json: bool, database: str | None, **options: Any
    ) -> None:
        db = RunRecords(database).db
        record = RunRecords(database).get(coordination)
        rows = WorkflowEvent.objects.using(db).filter(coordination_id=coordination)
        events = list(rows.order_by("key"))
        if record is None and not events:
            raise CommandError(
                f"No workflow run {coordination!r}. Run `{COMMAND} list` to see the runs."
            )
        if json:
            self.stdout.write(
                dump_json(
                    [
                        {"key": e.key, "value": e.value, "updated_at": iso(e.updated_at)}
                        for e in events
                    ]
                )
            )
            return
        if not events:
            self.stdout.write(f"Run {coordination!r} has published no events (ctx.set_event).")
            return
        now = timezone.now()
        table = [(e.key, timestamp_text(e.updated_at, now), state_text(e.value)) for e in events]
        self.write_table(format_table(EVENT_HEADERS, table))


def _refused(exc: UserJSONError) -> str:
    """Why the core refused an argument, and how to give it."""
    if exc.code == "json_not_object":
        return (
            f"{exc}; nothing was sent. Give --payload a JSON object, for example "
            "--payload '{\"amount\": 42}' (--payload '{}' for none)."
        )
    return f"{str(exc)[:1].upper()}{str(exc)[1:]}; nothing was sent."
