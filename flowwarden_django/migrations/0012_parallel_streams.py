# Streams handled in parallel (issue 32): the settled marks of transactional ones (an
# event that committed while an earlier one was unsettled, so that a restart skips it),
# and what each process reports of its window (in flight, the anchor"s lag, parked keys).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("flowwarden_django", "0011_sleep_cancel_children_timings"),
    ]

    operations = [
        migrations.AddField(
            model_name="streamworker",
            name="in_flight",
            field=models.IntegerField(default=0, verbose_name="in flight"),
        ),
        migrations.AddField(
            model_name="streamworker",
            name="parked_keys",
            field=models.JSONField(
                blank=True, default=list, verbose_name="parked keys"
            ),
        ),
        migrations.AddField(
            model_name="streamworker",
            name="watermark_lag",
            field=models.IntegerField(default=0, verbose_name="watermark lag"),
        ),
        migrations.CreateModel(
            name="StreamSettledEvent",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True,
                        primary_key=True,
                        serialize=False,
                        verbose_name="ID",
                    ),
                ),
                (
                    "stream_name",
                    models.CharField(max_length=255, verbose_name="stream"),
                ),
                (
                    "event_digest",
                    models.CharField(max_length=64, verbose_name="event digest"),
                ),
                (
                    "settled_at",
                    models.DateTimeField(auto_now_add=True, verbose_name="settled at"),
                ),
            ],
            options={
                "verbose_name": "settled stream event",
                "verbose_name_plural": "settled stream events",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("stream_name", "event_digest"),
                        name="fw_settled_event_once",
                    )
                ],
            },
        ),
    ]
