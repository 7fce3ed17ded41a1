from django.db import models


class Effect(models.Model):
    """One row per handled event: what a handler's database side effect looks like."""

    order_id = models.IntegerField(db_index=True)
    stream = models.CharField(max_length=100, default="")

    def __str__(self) -> str:
        return f"{self.stream}:{self.order_id}"


class MirrorDoc(models.Model):
    """A mirrored MongoDB document (the initial-sync tests): its ``_id`` and other fields."""

    doc_id = models.BigIntegerField(unique=True)
    data = models.JSONField(default=dict)

    def __str__(self) -> str:
        return f"mirror:{self.doc_id}"
