# Messages to runs (issue 47): the status "waiting_message" and the topic such a run
# waits for, the permission to send messages, a run's mailbox (WorkflowMessage, one
# row per message, bound once to the waiting snapshot it was delivered to) and the
# values a run publishes (WorkflowEvent, one row per run and key).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("flowwarden_django", "0012_parallel_streams"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="workflowrun",
            options={
                "ordering": ["-updated_at"],
                "permissions": [
                    ("fork_workflowrun", "Can fork a workflow run from a snapshot"),
                    ("upgrade_workflowrun", "Can upgrade workflow runs to another version"),
                    ("cancel_workflowrun", "Can cancel workflow runs"),
                    ("send_message_workflowrun", "Can send messages to workflow runs"),
                ],
                "verbose_name": "workflow run",
                "verbose_name_plural": "workflow runs",
            },
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="waiting_topic",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                max_length=255,
                verbose_name="waiting for topic",
            ),
        ),
        migrations.AlterField(
            model_name="workflowrun",
            name="status",
            field=models.CharField(
                choices=[
                    ("running", "running"),
                    ("hibernated", "hibernated"),
                    ("waiting", "waiting for approval"),
                    ("completed", "completed"),
                    ("failed", "failed"),
                    ("needs_upgrade", "needs upgrade"),
                    ("sleeping", "sleeping"),
                    ("waiting_children", "waiting for child runs"),
                    ("cancelled", "cancelled"),
                    ("waiting_message", "waiting for a message"),
                ],
                default="running",
                max_length=16,
                verbose_name="status",
            ),
        ),
        migrations.CreateModel(
            name="WorkflowEvent",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("coordination_id", models.CharField(max_length=255, verbose_name="coordination")),
                ("key", models.CharField(max_length=255, verbose_name="key")),
                ("value", models.JSONField(blank=True, null=True, verbose_name="value")),
                ("updated_at", models.DateTimeField(verbose_name="updated at")),
            ],
            options={
                "verbose_name": "workflow event",
                "verbose_name_plural": "workflow events",
                "ordering": ["coordination_id", "key"],
                "constraints": [
                    models.UniqueConstraint(fields=("coordination_id", "key"), name="fw_event_key")
                ],
            },
        ),
        migrations.CreateModel(
            name="WorkflowMessage",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("coordination_id", models.CharField(max_length=255, verbose_name="coordination")),
                ("topic", models.CharField(max_length=255, verbose_name="topic")),
                ("payload", models.JSONField(verbose_name="payload")),
                ("sender", models.CharField(blank=True, max_length=255, verbose_name="sender")),
                ("sent_at", models.DateTimeField(verbose_name="sent at")),
                (
                    "idempotency_key",
                    models.CharField(
                        blank=True, max_length=255, null=True, verbose_name="idempotency key"
                    ),
                ),
                (
                    "delivered_to",
                    models.CharField(
                        blank=True,
                        max_length=64,
                        null=True,
                        unique=True,
                        verbose_name="delivered to snapshot",
                    ),
                ),
                (
                    "delivered_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="delivered at"),
                ),
            ],
            options={
                "verbose_name": "workflow message",
                "verbose_name_plural": "workflow messages",
                "ordering": ["coordination_id", "id"],
                "indexes": [
                    models.Index(
                        fields=["coordination_id", "topic", "delivered_to", "id"],
                        name="fw_message_mailbox",
                    )
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("coordination_id", "idempotency_key"), name="fw_message_key"
                    )
                ],
            },
        ),
    ]
