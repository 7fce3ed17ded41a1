"""The streams of the initial-sync crash test: ``app.docs`` mirrored into ``MirrorDoc``.

Both streams start with ``COPY_EXISTING`` (``copy_batch_size`` from
``FLOWWARDEN_COPY_BATCH``, default 500) and keep a mirror that ends equal to the
collection whatever was redelivered: the copy and inserts upsert the whole document,
an update applies its ``updateDescription`` to the row (if the row is there: a
document deleted before its batch was never copied), a delete removes the row.

Each copied document also writes one ``Effect`` row (``order_id`` = its ``_id``,
``stream`` = :data:`SNAPSHOT`), a plain insert: the delivery log the test reads to
see where each consumer run started copying, and how often a document was copied.

* ``copy-mirror``: non-transactional; each statement commits on its own, so a batch
  cut short by a kill is copied again (and logged twice).
* ``copy-mirror-tx``: transactional; a batch's rows and its progress write commit
  together, so a killed batch leaves nothing and each document is logged once.
"""

import os
from typing import Any

from flowwarden_django.streams.registry import change_stream, checkpoint
from tests.crash.copy_sync import COLLECTION, DATABASE, SNAPSHOT, STREAM, TRANSACTIONAL_STREAM
from tests.testapp.models import Effect, MirrorDoc

BATCH = int(os.environ.get("FLOWWARDEN_COPY_BATCH", "500"))


def _fields(doc: Any) -> dict[str, Any]:
    return {key: value for key, value in doc.items() if key != "_id"}


class _Mirror:
    """Idempotent mirror handlers, plus one ``Effect`` row per copied document."""

    def on_snapshot(self, doc: Any) -> None:
        Effect.objects.create(order_id=doc["_id"], stream=SNAPSHOT)
        self.on_insert(doc)

    def on_insert(self, doc: Any) -> None:
        # One INSERT ... ON CONFLICT DO UPDATE: an upsert by _id.
        MirrorDoc.objects.bulk_create(
            [MirrorDoc(doc_id=doc["_id"], data=_fields(doc))],
            update_conflicts=True,
            unique_fields=["doc_id"],
            update_fields=["data"],
        )

    def on_update(self, ctx: Any) -> None:
        row = MirrorDoc.objects.filter(doc_id=ctx.document_key["_id"]).first()
        if row is None:
            return  # deleted before its batch was read: its delete event follows
        description = ctx.update_description
        data = dict(row.data)
        data.update(description.updated_fields)
        for path in description.removed_fields:
            data.pop(path, None)
        row.data = data
        row.save(update_fields=["data"])

    def on_delete(self, ctx: Any) -> None:
        MirrorDoc.objects.filter(doc_id=ctx.document_key["_id"]).delete()


@change_stream(name=STREAM, database=DATABASE, collection=COLLECTION)
@checkpoint(
    start_position="COPY_EXISTING",
    copy_batch_size=BATCH,
    save_every_n=1,  # the test waits for the anchor of the last write
    save_interval_seconds=0,
)
class CopyMirror(_Mirror):
    """Non-transactional: a batch cut short by a kill is copied again."""


@change_stream(
    name=TRANSACTIONAL_STREAM, database=DATABASE, collection=COLLECTION, transactional=True
)
@checkpoint(
    start_position="COPY_EXISTING", copy_batch_size=BATCH, save_every_n=1, save_interval_seconds=0
)
class CopyMirrorTx(_Mirror):
    """Transactional: each batch commits with its progress write, or not at all."""
