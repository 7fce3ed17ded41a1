"""The read-only admin page of stream checkpoints, through the Django test client."""

from datetime import timedelta

import pytest
from bson import ObjectId
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.test import RequestFactory, override_settings
from django.urls import reverse
from django.utils import timezone

from flowwarden_django.admin.checkpoints import StreamCheckpointAdmin, admin_stores
from flowwarden_django.models import StreamCheckpoint
from flowwarden_django.streams.backends.orm import OrmCheckpointStore
from flowwarden_django.streams.checkpoint import Checkpoint
from flowwarden_django.streams.initial_sync import encode_id

ORM = "flowwarden_django.streams.backends.orm.OrmCheckpointStore"
MEMORY = "flowwarden_django.streams.backends.memory.InMemoryCheckpointStore"

PROCESSED = "8263A1B2C3000000012B022C0100296E5A1004" + "AB" * 20 + "04"
SEEN = "8263A1B2C4000000022B022C0100296E5A1004" + "CD" * 20 + "04"

CHANGELIST = reverse("admin:flowwarden_django_streamcheckpoint_changelist")


def detail_url(stream_name: str) -> str:
    return reverse("admin:flowwarden_django_streamcheckpoint_change", args=[stream_name])


def ago(minutes: int) -> str:
    """The text ``timesince`` renders (it joins number and unit with a no-break space)."""
    return f"{minutes}\xa0minutes ago"


@pytest.fixture
def store():
    return OrmCheckpointStore()


@pytest.fixture
def streams(store):
    """``orders`` with both anchors and a heartbeat, ``payments`` with only a heartbeat."""
    now = timezone.now()
    store.save(
        Checkpoint(
            stream_name="orders",
            instance_id="worker-1",
            last_processed_token={"_data": PROCESSED},
            last_processed_at=now - timedelta(minutes=3, seconds=10),
            last_seen_token={"_data": SEEN},
            last_seen_at=now - timedelta(minutes=2, seconds=10),
            last_heartbeat_at=now - timedelta(minutes=2, seconds=10),
            metadata={"collection": "shop.orders"},
        )
    )
    store.save_heartbeat("payments", now - timedelta(minutes=7, seconds=10))
    return now


def text(response) -> str:
    return response.content.decode()


@pytest.mark.django_db
class TestChangelist:
    def test_lists_streams_with_tokens_and_ages(self, admin_client, streams):
        response = admin_client.get(CHANGELIST)
        assert response.status_code == 200
        body = text(response)
        assert "<h1>Stream checkpoints</h1>" in body
        for header in ("Stream", "Instance id", "Last processed token", "Processed age"):
            assert header in body
        for header in ("Last seen token", "Seen age", "Heartbeat age"):
            assert header in body
        assert ">orders</span></a>" in body and ">payments</span></a>" in body
        assert "worker-1" in body
        # Short token: the start of _data and an ellipsis; the full relaxed EJSON as a title.
        assert f">{PROCESSED[:19]}…</code>" in body
        assert f'title="{{&quot;_data&quot;: &quot;{PROCESSED}&quot;}}"' in body
        assert f">{SEEN[:19]}…</code>" in body
        # Ages read as text, with the exact timestamp as a title.
        row = StreamCheckpoint.objects.get(pk="orders")
        assert f'title="{row.last_processed_at.isoformat()}">{ago(3)}</time>' in body
        assert f'title="{row.last_seen_at.isoformat()}">{ago(2)}</time>' in body

    def test_heartbeat_age_of_a_stream_without_tokens(self, admin_client, streams):
        body = text(admin_client.get(CHANGELIST, {"q": "payments"}))
        row = StreamCheckpoint.objects.get(pk="payments")
        assert f'title="{row.last_heartbeat_at.isoformat()}">{ago(7)}</time>' in body
        # Only a heartbeat was written: no tokens and no anchor ages.
        for column in ("processed_token", "processed_age", "seen_token", "seen_age"):
            assert body.count(f'<td class="field-{column}">—</td>') == 1

    def test_search_by_stream_name(self, admin_client, streams):
        body = text(admin_client.get(CHANGELIST, {"q": "ord"}))
        assert ">orders</span></a>" in body
        assert ">payments</span></a>" not in body
        body = text(admin_client.get(CHANGELIST, {"q": "nothing-matches"}))
        assert ">orders</span></a>" not in body and ">payments</span></a>" not in body

    @pytest.mark.parametrize(
        ("order", "first", "second"),
        [("0", "orders", "payments"), ("-0", "payments", "orders"), ("5", "payments", "orders")],
    )
    def test_sortable_columns(self, admin_client, streams, order, first, second):
        # Column 5 is the seen age: payments has none, and SQLite sorts NULL first.
        body = text(admin_client.get(CHANGELIST, {"o": order}))
        assert body.index(f">{first}</span></a>") < body.index(f">{second}</span></a>")

    def test_age_columns_are_sortable_links(self, admin_client, streams):
        body = text(admin_client.get(CHANGELIST))
        for column in ("processed_age", "seen_age", "heartbeat_age"):
            assert f'<th scope="col" class="sortable column-{column}">' in body

    def test_no_note_when_every_store_is_shown(self, admin_client, streams):
        assert "flowwarden_checkpoints list" not in text(admin_client.get(CHANGELIST))


@pytest.mark.django_db
class TestDetail:
    def test_shows_the_full_decoded_token_and_metadata(self, admin_client, streams):
        response = admin_client.get(detail_url("orders"))
        assert response.status_code == 200
        body = text(response)
        assert '<pre class="flowwarden-token">{\n  &quot;_data&quot;: ' in body
        assert f"&quot;_data&quot;: &quot;{PROCESSED}&quot;\n}}</pre>" in body
        assert f"&quot;_data&quot;: &quot;{SEEN}&quot;\n}}</pre>" in body
        assert "<pre>{\n  &quot;collection&quot;: &quot;shop.orders&quot;\n}</pre>" in body
        assert "worker-1" in body
        row = StreamCheckpoint.objects.get(pk="orders")
        assert row.last_processed_at.isoformat() in body

    def test_relaxed_extended_json_of_non_string_fields(self, admin_client, store):
        token = {"_data": PROCESSED, "_typeBits": b"\x01", "n": 5}
        store.save_processed("typed", token, timezone.now())
        body = text(admin_client.get(detail_url("typed")))
        assert "&quot;$binary&quot;" in body
        assert "&quot;n&quot;: 5" in body

    def test_stream_without_tokens_renders_dashes(self, admin_client, store):
        store.save(Checkpoint(stream_name="fresh"))
        body = text(admin_client.get(CHANGELIST))
        assert ">fresh</span></a>" in body
        for column in ("processed_token", "processed_age", "seen_token", "seen_age"):
            assert f'<td class="field-{column}">—</td>' in body
        assert '<td class="field-heartbeat_age">—</td>' in body
        response = admin_client.get(detail_url("fresh"))
        assert response.status_code == 200
        assert text(response).count('<div class="readonly">—</div>') >= 5

    def test_shows_the_initial_sync_progress(self, admin_client, store, streams):
        started = streams - timedelta(minutes=5)
        updated = streams - timedelta(minutes=1)
        progress = {
            "phase": "copying",
            "reason": "first start",
            "batch": 12,
            "last_id": encode_id(ObjectId("65a1b2c3d4e5f60718293a4b")),
            "copied": 12000,
            "estimated": 50000,
            "started_at": started.isoformat(),
            "updated_at": updated.isoformat(),
            "finished_at": None,
        }
        assert store.save_initial_sync("orders", progress, expected_batch=None)
        body = text(admin_client.get(detail_url("orders")))
        assert "Initial sync</h2>" in body
        assert '<table class="flowwarden-initial-sync">' in body
        for label, value in (
            ("phase", "copying (first start)"),
            ("copied", "12,000 of ~50,000 (24%)"),
            ("finished at", "—"),
            ("last _id", "<code>{&quot;$oid&quot;: &quot;65a1b2c3d4e5f60718293a4b&quot;}</code>"),
            ("batch", "12"),
        ):
            assert f'<tr><th scope="row">{label}</th><td>{value}</td></tr>' in body
        # Times as the other fields show them: exact, then their age.
        assert f'<th scope="row">started at</th><td>{started.isoformat()} (<time' in body
        assert f'title="{started.isoformat()}">{ago(5)}</time>' in body
        assert f'<th scope="row">last batch at</th><td>{updated.isoformat()} (<time' in body

    def test_a_finished_copy_with_an_id_it_cannot_decode(self, admin_client, store):
        finished = timezone.now() - timedelta(minutes=9)
        progress = {
            "phase": "done",
            "reason": "history lost",
            "batch": 3,
            "last_id": "<not-ejson>",
            "copied": 300,
            "estimated": 250,
            "started_at": (finished - timedelta(minutes=1)).isoformat(),
            "finished_at": finished.isoformat(),
        }
        assert store.save_initial_sync("copied", progress, expected_batch=None)
        body = text(admin_client.get(detail_url("copied")))
        assert '<th scope="row">phase</th><td>done (history lost)</td>' in body
        assert '<th scope="row">copied</th><td>300 of ~250 (100%)</td>' in body
        assert '<th scope="row">last _id</th><td><code>&lt;not-ejson&gt;</code></td>' in body
        assert f'<th scope="row">finished at</th><td>{finished.isoformat()} (<time' in body
        assert "last batch at" not in body  # a record without updated_at

    def test_a_stream_that_never_copied_has_no_progress_table(self, admin_client, streams):
        body = text(admin_client.get(detail_url("orders")))
        assert "Initial sync</h2>" in body
        assert "flowwarden-initial-sync" not in body
        assert '<div class="readonly">—</div>' in body

    def test_empty_and_corrupt_token_bytes_do_not_crash(self, admin_client):
        StreamCheckpoint.objects.create(
            stream_name="odd", last_seen_token=b"", last_processed_token=b"\x05\x00"
        )
        for url in (CHANGELIST, detail_url("odd")):
            response = admin_client.get(url)
            assert response.status_code == 200
            assert "undecodable (2 bytes)" in text(response)


@pytest.mark.django_db
class TestReadOnly:
    def test_add_is_forbidden(self, admin_client, streams):
        add_url = reverse("admin:flowwarden_django_streamcheckpoint_add")
        assert admin_client.get(add_url).status_code == 403
        assert add_url not in text(admin_client.get(CHANGELIST))

    def test_no_delete_action_or_link(self, admin_client, streams):
        body = text(admin_client.get(CHANGELIST))
        assert "delete_selected" not in body
        assert 'name="action"' not in body
        delete_url = reverse("admin:flowwarden_django_streamcheckpoint_delete", args=["orders"])
        detail = text(admin_client.get(detail_url("orders")))
        assert delete_url not in detail
        assert 'class="deletelink"' not in detail
        assert admin_client.get(delete_url).status_code == 403
        assert admin_client.post(delete_url, {"post": "yes"}).status_code == 403
        assert StreamCheckpoint.objects.filter(pk="orders").exists()

    def test_detail_cannot_be_saved(self, admin_client, streams):
        detail = text(admin_client.get(detail_url("orders")))
        assert 'name="_save"' not in detail
        response = admin_client.post(detail_url("orders"), {"instance_id": "intruder"})
        assert response.status_code == 403
        assert StreamCheckpoint.objects.get(pk="orders").instance_id == "worker-1"

    def test_staff_without_view_permission_is_forbidden(self, client, streams):
        user = User.objects.create_user("staff", password="pw", is_staff=True)
        client.force_login(user)
        assert client.get(CHANGELIST).status_code == 403
        assert client.get(detail_url("orders")).status_code == 403
        assert "Stream checkpoints" not in text(client.get(reverse("admin:index")))

    def test_staff_with_view_permission_can_view(self, client, streams):
        user = User.objects.create_user("viewer", password="pw", is_staff=True)
        user.user_permissions.add(Permission.objects.get(codename="view_streamcheckpoint"))
        client.force_login(user)
        assert client.get(CHANGELIST).status_code == 200
        assert client.get(detail_url("orders")).status_code == 200


@pytest.mark.django_db
class TestOtherStores:
    def test_note_names_stores_not_shown(self, admin_client, streams):
        stores = {"default": {"BACKEND": ORM}, "cache": {"BACKEND": MEMORY}}
        with override_settings(FLOWWARDEN={"CHECKPOINT_STORES": stores}):
            body = text(admin_client.get(CHANGELIST))
        assert '<li class="info">' in body
        assert "“cache” (InMemoryCheckpointStore) is not shown on this page" in body
        assert "<code>python manage.py flowwarden_checkpoints list --store cache</code>" in body
        assert "--store default" not in body
        assert ">orders</span></a>" in body

    def test_aliases_that_fail_to_load_are_ignored(self, admin_client, streams):
        stores = {
            "default": {"BACKEND": ORM},
            "broken": {"BACKEND": "no.such.Backend"},
            "shapeless": "not a dict",
        }
        with override_settings(FLOWWARDEN={"CHECKPOINT_STORES": stores}):
            response = admin_client.get(CHANGELIST)
        assert response.status_code == 200
        assert "flowwarden_checkpoints list" not in text(response)


class TestDatabaseAlias:
    def test_reads_the_database_of_the_default_orm_alias(self):
        stores = {
            "default": {"BACKEND": ORM, "OPTIONS": {"using": "replica"}},
            "cache": {"BACKEND": MEMORY},
        }
        with override_settings(FLOWWARDEN={"CHECKPOINT_STORES": stores}):
            assert admin_stores().using == "replica"
            model_admin = StreamCheckpointAdmin(StreamCheckpoint, admin_site=None)
            request = RequestFactory().get(CHANGELIST)
            assert model_admin.get_queryset(request).db == "replica"

    def test_router_decides_without_using(self):
        assert admin_stores().using is None
        model_admin = StreamCheckpointAdmin(StreamCheckpoint, admin_site=None)
        assert model_admin.get_queryset(RequestFactory().get(CHANGELIST)).db == "default"

    def test_orm_alias_on_another_database_is_listed_as_hidden(self):
        stores = {
            "default": {"BACKEND": ORM},
            "archive": {"BACKEND": ORM, "OPTIONS": {"using": "archive"}},
            "same": {"BACKEND": ORM, "OPTIONS": {"using": "default"}},
        }
        with override_settings(FLOWWARDEN={"CHECKPOINT_STORES": stores}):
            hidden = admin_stores().hidden
        assert [store.alias for store in hidden] == ["archive"]
        assert hidden[0].command == "python manage.py flowwarden_checkpoints list --store archive"


@pytest.mark.skipif("other" not in settings.DATABASES, reason="needs the 'other' test database")
@pytest.mark.django_db(databases=["default", "other"])
def test_changelist_reads_the_orm_store_database(admin_client):
    OrmCheckpointStore(using="other").save_heartbeat("on-other", timezone.now())
    OrmCheckpointStore(using="default").save_heartbeat("on-default", timezone.now())
    stores = {"default": {"BACKEND": ORM, "OPTIONS": {"using": "other"}}}
    with override_settings(FLOWWARDEN={"CHECKPOINT_STORES": stores}):
        body = text(admin_client.get(CHANGELIST))
        assert admin_client.get(detail_url("on-other")).status_code == 200
    assert ">on-other</span></a>" in body
    assert ">on-default</span></a>" not in body
