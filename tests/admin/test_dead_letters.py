"""The dead-letter console in the admin, through the Django test client.

Entries are parked through the ORM DLQ store with the real error of a registered
stream's handler, which fails until the test "fixes" it; every operation runs
through ``streams/operations/replay.py`` against that store.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from bson import Decimal128, ObjectId
from django.contrib.admin import helpers
from django.contrib.auth.models import Permission, User
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from flowwarden_django.admin import dead_letters
from flowwarden_django.admin.dead_letters import dlq_admin_stores
from flowwarden_django.models import DeadLetter as DeadLetterRow
from flowwarden_django.streams.dlq import (
    ACKNOWLEDGED,
    DISCARDED,
    PENDING,
    REPLAYED,
    DeadLetter,
    DlqPolicy,
    ErrorInfo,
    dead_letter_id,
    error_info,
)
from flowwarden_django.streams.operations.replay import run_handlers
from flowwarden_django.streams.registry import register_stream, stream_registry
from flowwarden_django.streams.stores import dlq_stores
from tests.testapp.models import Effect

STREAM = "dlq-admin-orders"
OTHER_STREAM = "dlq-admin-payments"

CHANGELIST = reverse("admin:flowwarden_django_deadletter_changelist")
ORM_DLQ = "flowwarden_django.streams.backends.orm.OrmDlqStore"
MEMORY_DLQ = "flowwarden_django.streams.backends.memory.InMemoryDlqStore"


def change_url(entry_id: str) -> str:
    return reverse("admin:flowwarden_django_deadletter_change", args=[entry_id])


def operation_url(entry_id: str, operation: str) -> str:
    return reverse(f"admin:flowwarden_django_deadletter_{operation}", args=[entry_id])


class PaymentRejectedError(RuntimeError):
    """What the poison handler raises until it is fixed."""


@dataclasses.dataclass
class PoisonStream:
    """A registered stream whose insert handler raises until ``fixed`` is set;
    once fixed it records an ``Effect`` row per order."""

    name: str
    fixed: bool = False

    def on_insert(self, doc: dict[str, Any], ctx: Any) -> None:
        if not self.fixed:
            raise PaymentRejectedError(f"payment service rejected order {doc['orderId']}")
        Effect.objects.create(order_id=doc["orderId"], stream=ctx.stream_name)

    def register(self) -> PoisonStream:
        register_stream(self.name, "orders", on_insert=self.on_insert)
        return self

    def unregister(self) -> None:
        stream_registry.unregister(self.name)


def park(
    stream: str,
    order_id: int,
    *,
    status: str = PENDING,
    created_at: datetime | None = None,
    error: ErrorInfo | None = None,
) -> DeadLetter:
    """Save one dead letter of order *order_id* through the ``"default"`` DLQ store.

    Unless *error* is given, the error is what the stream's handler raises now
    (with its real traceback), as if the runtime had parked the event.
    """
    created_at = created_at or timezone.now()
    token = {"_data": f"8263A1B2C3000000012B022C0100296E5A1004{order_id:040X}04"}
    oid = ObjectId(f"65a1b2c3d4e5f6{order_id:010x}")
    entry = DeadLetter(
        id=dead_letter_id(stream, token),
        stream_name=stream,
        operation_type="insert",
        error=ErrorInfo("placeholder", ""),
        attempts=3,
        created_at=created_at,
        first_attempt_at=created_at - timedelta(seconds=3),
        last_attempt_at=created_at,
        document_key={"_id": oid},
        full_document={
            "_id": oid,
            "orderId": order_id,
            "total": Decimal128(Decimal("12.50")),
            "placedAt": datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
        },
        resume_token=token,
        status=status,
        metadata={"tenant": "acme"},
    )
    if error is None:
        try:
            run_handlers(stream_registry.get(stream), entry)
        except Exception as exc:
            error = error_info(exc)
        else:
            raise AssertionError("the poison handler did not fail")
    entry = entry.replace(error=error)
    dlq_stores["default"].save(entry, DlqPolicy())
    return entry


def row(entry: DeadLetter) -> DeadLetterRow:
    return DeadLetterRow.objects.get(pk=entry.id)


def page(response) -> str:
    return response.content.decode()


def staff(username: str, *codenames: str) -> User:
    """A staff user with the given ``flowwarden_django`` permissions."""
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="flowwarden_django", codename__in=codenames
        )
    )
    return user


def run_action(client, action: str, *entries: DeadLetter, confirm: bool = True, **extra):
    """POST a changelist action (the first step), then its confirmation (``post=yes``)."""
    data = {
        "action": action,
        "index": "0",
        helpers.ACTION_CHECKBOX_NAME: [e.id for e in entries],
    }
    response = client.post(CHANGELIST, data)
    if not confirm:
        return response
    data = {"action": action, "post": "yes", helpers.ACTION_CHECKBOX_NAME: [e.id for e in entries]}
    return client.post(CHANGELIST, {**data, **extra}, follow=True)


@pytest.fixture
def orders():
    """The poison stream, registered for the test and unregistered afterwards."""
    stream = PoisonStream(STREAM).register()
    try:
        yield stream
    finally:
        stream.unregister()


@pytest.fixture
def payments():
    stream = PoisonStream(OTHER_STREAM).register()
    try:
        yield stream
    finally:
        stream.unregister()


pytestmark = pytest.mark.django_db(transaction=True)


class TestChangelist:
    def test_lists_entries_with_filters(self, admin_client, orders, payments):
        now = timezone.now()
        first = park(STREAM, 42, created_at=now - timedelta(minutes=5))
        park(OTHER_STREAM, 7, created_at=now - timedelta(minutes=2))
        response = admin_client.get(CHANGELIST)
        assert response.status_code == 200
        body = page(response)
        assert "<h1>Select dead letter to view</h1>" in body
        for header in ("Created", "Stream / operation", "Document key", "Error type"):
            assert header in body
        assert "Status, attempts, replays" in body and "3 attempts, 0 replays" in body
        # The document key's ObjectId, short (its start and its distinctive end); the
        # whole key as relaxed EJSON in the title.
        oid = f"65a1b2c3d4e5f6{42:010x}"
        assert (
            f'<code title="{{&quot;_id&quot;: {{&quot;$oid&quot;: &quot;{oid}&quot;}}}}">' in body
        )
        assert f">{oid[:4]}…{oid[-8:]}</code>" in body
        # The error type's class name, the dotted path as its title.
        assert (
            'title="tests.admin.test_dead_letters.PaymentRejectedError">PaymentRejectedError'
            in body
        )
        assert 'data-status="PENDING"' in body and "icon-alert.svg" in body
        # Filters: one entry per stream name, statuses, operations; a date hierarchy.
        assert 'id="changelist-filter"' in body
        assert f'href="?stream_name={STREAM}"' in body
        assert f'href="?stream_name={OTHER_STREAM}"' in body
        assert 'href="?status__exact=REPLAYED"' in body
        assert 'href="?operation_type=insert"' in body
        assert f'href="?created_at__year={first.created_at.year}"' in body
        # Filtering by stream keeps that stream's entries only.
        body = page(admin_client.get(CHANGELIST, {"stream_name": STREAM}))
        assert change_url(first.id) in body
        assert body.count('class="action-select"') == 1

    def test_search_by_id_and_error_message(self, admin_client, orders, payments):
        first = park(STREAM, 42)
        second = park(OTHER_STREAM, 7)
        body = page(admin_client.get(CHANGELIST, {"q": first.id}))
        assert change_url(first.id) in body and change_url(second.id) not in body
        body = page(admin_client.get(CHANGELIST, {"q": '"rejected order 7"'}))
        assert change_url(second.id) in body and change_url(first.id) not in body

    def test_read_only(self, admin_client, orders):
        entry = park(STREAM, 42)
        body = page(admin_client.get(CHANGELIST))
        assert "delete_selected" not in body
        assert "deadletter/add/" not in body
        assert (
            admin_client.get(reverse("admin:flowwarden_django_deadletter_add")).status_code == 403
        )
        delete = reverse("admin:flowwarden_django_deadletter_delete", args=[entry.id])
        assert admin_client.post(delete, {"post": "yes"}).status_code == 403
        response = admin_client.post(change_url(entry.id), {"status": DISCARDED})
        assert response.status_code == 403
        assert row(entry).status == PENDING

    def test_other_stores_are_named_and_nothing_can_be_done(self, admin_client, orders):
        entry = park(STREAM, 42)
        stores = {"default": {"BACKEND": MEMORY_DLQ}}
        with override_settings(FLOWWARDEN={"DLQ_STORES": stores}):
            assert dlq_admin_stores().alias is None
            body = page(admin_client.get(CHANGELIST))
            assert "The dead-letter store “default” (InMemoryDlqStore) is not shown" in body
            assert "No ORM dead-letter store is configured" in body
            assert 'name="action"' not in body
            assert "/replay/" not in page(admin_client.get(change_url(entry.id)))

    def test_the_orm_alias_default_wins_and_others_elsewhere_are_named(self):
        stores = {
            "archive": {"BACKEND": ORM_DLQ, "OPTIONS": {"using": "other"}},
            "default": {"BACKEND": ORM_DLQ},
            "same": {"BACKEND": ORM_DLQ, "OPTIONS": {"using": "default"}},
        }
        with override_settings(FLOWWARDEN={"DLQ_STORES": stores}):
            found = dlq_admin_stores()
        assert (found.alias, found.using) == ("default", "default")
        assert [(h.alias, h.backend) for h in found.hidden] == [
            ("archive", "OrmDlqStore on database 'other'")
        ]


class TestDetail:
    def test_shows_decoded_documents_stack_trace_and_history(self, admin_client, orders):
        entry = park(STREAM, 42)
        response = admin_client.get(change_url(entry.id))
        assert response.status_code == 200
        body = page(response)
        oid = f"65a1b2c3d4e5f6{42:010x}"
        # Pretty relaxed Extended JSON of the BSON documents.
        assert (
            '<pre class="flowwarden-bson">{\n  &quot;_id&quot;: {\n'
            f"    &quot;$oid&quot;: &quot;{oid}&quot;\n  }}\n}}</pre>"
        ) in body
        assert "&quot;orderId&quot;: 42," in body
        assert "&quot;$numberDecimal&quot;: &quot;12.50&quot;" in body
        assert "&quot;$date&quot;: &quot;2025-01-02T03:04:05Z&quot;" in body
        assert f"&quot;_data&quot;: &quot;{entry.resume_token['_data']}&quot;" in body
        # The handler's real traceback, in a <pre>.
        assert '<pre class="flowwarden-stack-trace">Traceback (most recent call last):' in body
        assert "in on_insert" in body
        assert "PaymentRejectedError: payment service rejected order 42" in body
        assert "&quot;tenant&quot;: &quot;acme&quot;" in body
        assert "Replay history" in body
        # View only: no save button; the operations are object tools.
        assert 'name="_save"' not in body
        for operation in ("replay", "acknowledge", "discard"):
            assert f'href="{operation_url(entry.id, operation)}"' in body

    def test_no_operation_buttons_on_a_settled_entry(self, admin_client, orders):
        entry = park(STREAM, 42, status=ACKNOWLEDGED)
        body = page(admin_client.get(change_url(entry.id)))
        assert 'data-status="ACKNOWLEDGED"' in body
        assert "/replay/" not in body and "/discard/" not in body

    def test_undecodable_bytes_are_shown_not_raised(self, admin_client, orders):
        entry = park(STREAM, 42)
        DeadLetterRow.objects.filter(pk=entry.id).update(full_document=b"\x05\x00")
        response = admin_client.get(change_url(entry.id))
        assert response.status_code == 200
        assert "undecodable (2 bytes)" in page(response)


class TestPermissions:
    def test_view_only_user_sees_no_actions_and_a_post_does_nothing(self, client, orders):
        entry = park(STREAM, 42)
        client.force_login(staff("viewer", "view_deadletter"))
        body = page(client.get(CHANGELIST))
        assert change_url(entry.id) in body
        assert 'name="action"' not in body and "replay_selected" not in body
        assert "/replay/" not in page(client.get(change_url(entry.id)))
        orders.fixed = True
        run_action(client, "replay_selected", entry)
        assert row(entry).status == PENDING and row(entry).replay_count == 0
        assert not Effect.objects.exists()
        for operation in ("replay", "acknowledge", "discard"):
            assert client.get(operation_url(entry.id, operation)).status_code == 403
            assert (
                client.post(operation_url(entry.id, operation), {"post": "yes"}).status_code == 403
            )
        assert row(entry).status == PENDING

    def test_replay_permission_does_not_allow_resolving(self, client, orders):
        entry = park(STREAM, 42)
        client.force_login(staff("replayer", "view_deadletter", "replay_deadletter"))
        body = page(client.get(CHANGELIST))
        assert 'value="replay_selected"' in body
        assert 'value="acknowledge_selected"' not in body
        assert 'value="discard_selected"' not in body
        response = run_action(client, "acknowledge_selected", entry)
        assert "No action selected." in page(response)
        assert row(entry).status == PENDING
        assert client.post(operation_url(entry.id, "discard"), {"post": "yes"}).status_code == 403
        assert row(entry).status == PENDING

    def test_resolve_permission_does_not_allow_replaying(self, client, orders):
        entry = park(STREAM, 42)
        client.force_login(staff("resolver", "view_deadletter", "resolve_deadletter"))
        body = page(client.get(CHANGELIST))
        assert 'value="replay_selected"' not in body
        assert 'value="acknowledge_selected"' in body and 'value="discard_selected"' in body
        orders.fixed = True
        run_action(client, "replay_selected", entry)
        assert row(entry).status == PENDING
        assert not Effect.objects.exists()

    def test_without_view_permission_the_console_is_closed(self, client, orders):
        entry = park(STREAM, 42)
        client.force_login(staff("outsider", "replay_deadletter"))
        assert client.get(CHANGELIST).status_code == 403
        assert client.get(operation_url(entry.id, "replay")).status_code == 403


class TestReplay:
    def test_confirmation_page_then_success(self, admin_client, orders):
        entry = park(STREAM, 42)
        response = run_action(admin_client, "replay_selected", entry, confirm=False)
        assert response.status_code == 200
        body = page(response)
        assert "<h1>Replay dead letters</h1>" in body
        assert f'<a href="{change_url(entry.id)}">{entry.id}</a>' in body
        assert f'name="{helpers.ACTION_CHECKBOX_NAME}" value="{entry.id}"' in body
        assert '<input type="hidden" name="action" value="replay_selected">' in body
        assert '<input type="hidden" name="post" value="yes">' in body
        assert 'class="submit-row"' in body and 'value="Yes, replay"' in body
        assert 'class="breadcrumbs"' in body
        # Nothing happened yet.
        assert row(entry).status == PENDING

        orders.fixed = True
        response = run_action(admin_client, "replay_selected", entry)
        assert response.redirect_chain[-1][0].startswith(CHANGELIST)
        body = page(response)
        assert '<li class="success">Replayed 1 dead letter.</li>' in body
        assert 'data-status="REPLAYED"' in body
        stored = row(entry)
        assert stored.status == REPLAYED
        assert stored.replay_count == 1 and stored.last_replayed_at is not None
        assert stored.resolved_by == "admin"
        assert list(Effect.objects.values_list("order_id", "stream")) == [(42, STREAM)]

    def test_failure_keeps_the_entry_pending_and_shows_the_error(self, admin_client, orders):
        entry = park(STREAM, 42)
        response = run_action(admin_client, "replay_selected", entry)
        body = page(response)
        assert (
            f'<li class="error">Replay of dead letter “{entry.id}” ({STREAM}) failed: '
            "PaymentRejectedError: payment service rejected order 42</li>"
        ) in body
        assert "Replayed" not in body.split('<ul class="messagelist">')[1].split("</ul>")[0]
        stored = row(entry)
        assert stored.status == PENDING
        assert stored.replay_count == 1
        assert not Effect.objects.exists()

    def test_failures_and_successes_are_reported_per_entry(self, admin_client, orders, payments):
        good = park(STREAM, 1)
        bad = park(OTHER_STREAM, 2)
        orders.fixed = True
        body = page(run_action(admin_client, "replay_selected", good, bad))
        assert '<li class="success">Replayed 1 dead letter.</li>' in body
        assert f"Replay of dead letter “{bad.id}” ({OTHER_STREAM}) failed" in body
        assert (row(good).status, row(bad).status) == (REPLAYED, PENDING)

    def test_a_stream_no_longer_declared_fails_the_replay(self, admin_client):
        stream = PoisonStream("dlq-admin-gone").register()
        try:
            entry = park("dlq-admin-gone", 5)
        finally:
            stream.unregister()
        body = page(run_action(admin_client, "replay_selected", entry))
        assert "no stream &#x27;dlq-admin-gone&#x27;" in body
        assert row(entry).status == PENDING

    def test_non_pending_entries_are_skipped_with_a_message(self, admin_client, orders):
        pending = park(STREAM, 1)
        acknowledged = park(STREAM, 2, status=ACKNOWLEDGED)
        orders.fixed = True
        confirmation = page(
            run_action(admin_client, "replay_selected", pending, acknowledged, confirm=False)
        )
        assert "not pending: will be skipped" in confirmation
        body = page(run_action(admin_client, "replay_selected", pending, acknowledged))
        assert '<li class="success">Replayed 1 dead letter.</li>' in body
        assert (
            '<li class="warning">Skipped 1 dead letter that is not pending: '
            f"{acknowledged.id} (acknowledged)</li>"
        ) in body
        assert (row(pending).status, row(acknowledged).status) == (REPLAYED, ACKNOWLEDGED)
        assert row(acknowledged).replay_count == 0
        assert Effect.objects.count() == 1

    def test_from_the_entry_page(self, admin_client, orders):
        entry = park(STREAM, 42)
        url = operation_url(entry.id, "replay")
        body = page(admin_client.get(url))
        assert "<h1>Replay dead letters</h1>" in body
        assert f'href="{change_url(entry.id)}" class="closelink"' in body
        assert 'name="action"' not in body
        orders.fixed = True
        response = admin_client.post(url, {"post": "yes"}, follow=True)
        assert response.redirect_chain == [(change_url(entry.id), 302)]
        body = page(response)
        assert '<li class="success">Replayed 1 dead letter.</li>' in body
        assert row(entry).status == REPLAYED
        # A second replay of the same entry is refused: it is no longer pending.
        body = page(admin_client.post(url, {"post": "yes"}, follow=True))
        assert f"Skipped 1 dead letter that is not pending: {entry.id} (replayed)" in body
        assert Effect.objects.count() == 1

    def test_replays_are_logged_in_the_history(self, admin_client, orders):
        entry = park(STREAM, 42)
        orders.fixed = True
        run_action(admin_client, "replay_selected", entry)
        history = reverse("admin:flowwarden_django_deadletter_history", args=[entry.id])
        assert "Replayed from the dead-letter console." in page(admin_client.get(history))


class TestResolve:
    def test_acknowledge_with_a_note(self, admin_client, orders):
        entry = park(STREAM, 42)
        confirmation = page(run_action(admin_client, "acknowledge_selected", entry, confirm=False))
        assert "<h1>Acknowledge dead letters</h1>" in confirmation
        assert 'name="note"' in confirmation
        body = page(
            run_action(admin_client, "acknowledge_selected", entry, note="  refunded by hand ")
        )
        assert '<li class="success">Acknowledged 1 dead letter.</li>' in body
        stored = row(entry)
        assert stored.status == ACKNOWLEDGED
        assert (stored.resolved_by, stored.note) == ("admin", "refunded by hand")
        assert stored.resolved_at is not None and stored.replay_count == 0

    def test_discard(self, admin_client, orders):
        first, second = park(STREAM, 1), park(STREAM, 2)
        body = page(run_action(admin_client, "discard_selected", first, second))
        assert '<li class="success">Discarded 2 dead letters.</li>' in body
        assert {row(first).status, row(second).status} == {DISCARDED}
        # Discarded entries are kept (until they expire), just settled.
        assert DeadLetterRow.objects.count() == 2

    def test_a_store_error_fails_one_entry_and_the_others_go_on(
        self, admin_client, orders, monkeypatch
    ):
        first, second = park(STREAM, 1), park(STREAM, 2)
        real = dead_letters.acknowledge_dead_letter

        def flaky(entry_id, **kwargs):
            if entry_id == first.id:
                raise ConnectionError("database went away")
            return real(entry_id, **kwargs)

        monkeypatch.setattr(dead_letters, "acknowledge_dead_letter", flaky)
        body = page(run_action(admin_client, "acknowledge_selected", first, second))
        assert '<li class="success">Acknowledged 1 dead letter.</li>' in body
        assert (
            f"Dead letter “{first.id}” ({STREAM}) could not be acknowledged: "
            "ConnectionError: database went away"
        ) in body
        assert (row(first).status, row(second).status) == (PENDING, ACKNOWLEDGED)

    def test_discard_from_the_entry_page_skips_a_settled_entry(self, admin_client, orders):
        entry = park(STREAM, 42, status=REPLAYED)
        url = operation_url(entry.id, "discard")
        confirmation = page(admin_client.get(url))
        assert "disabled" in confirmation
        body = page(admin_client.post(url, {"post": "yes", "note": "x"}, follow=True))
        assert f"Skipped 1 dead letter that is not pending: {entry.id} (replayed)" in body
        assert row(entry).status == REPLAYED and row(entry).note == ""

    def test_unknown_entry(self, admin_client):
        response = admin_client.get(operation_url("nope", "acknowledge"), follow=True)
        assert "Dead letter with ID “nope” doesn" in page(response)
