"""Database models of flowwarden-django."""

from django.db import models
from django.utils.translation import gettext_lazy as _


class StreamCheckpoint(models.Model):
    """The ORM checkpoint store's row: one per stream, both anchors side by side.

    Tokens are stored as their BSON bytes so that equality in SQL is exact on every
    database (the history-lost guard compares them in the UPDATE itself).
    Rows are written only through ``OrmCheckpointStore``.
    """

    stream_name = models.CharField(_("stream"), max_length=255, primary_key=True)
    # NULL and "" differ here: NULL means no owner was ever recorded.
    instance_id = models.CharField(  # noqa: DJ001
        _("instance id"), max_length=255, null=True, blank=True
    )
    last_seen_token = models.BinaryField(_("last seen token"), null=True)
    last_seen_at = models.DateTimeField(_("last seen at"), null=True)
    last_processed_token = models.BinaryField(_("last processed token"), null=True)
    last_processed_at = models.DateTimeField(_("last processed at"), null=True)
    last_heartbeat_at = models.DateTimeField(_("last heartbeat at"), null=True)
    metadata = models.JSONField(_("metadata"), default=dict, blank=True)

    class Meta:
        verbose_name = _("stream checkpoint")
        verbose_name_plural = _("stream checkpoints")
        ordering = ["stream_name"]

    def __str__(self) -> str:
        return self.stream_name
