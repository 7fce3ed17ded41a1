# Durable sleep, cancel, child runs and step timings (issue 31): a sleeping run's
# wake time (and the index the sweep finds due sleepers by), the statuses "sleeping",
# "waiting_children" and "cancelled", a child run's parent, the permission to cancel
# runs, and the errors of a step's failed attempts while a provider runs each attempt
# on its own (Temporal).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("flowwarden_django", "0010_workflow_versions"),
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
                ],
                "verbose_name": "workflow run",
                "verbose_name_plural": "workflow runs",
            },
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="parent_coordination_id",
            field=models.CharField(
                blank=True, db_index=True, max_length=255, null=True, verbose_name="parent run"
            ),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="step_errors",
            field=models.JSONField(
                blank=True, editable=False, null=True, verbose_name="step errors"
            ),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="wake_at",
            field=models.DateTimeField(blank=True, null=True, verbose_name="wakes at"),
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
                ],
                default="running",
                max_length=16,
                verbose_name="status",
            ),
        ),
        migrations.AddIndex(
            model_name="workflowrun",
            index=models.Index(fields=["status", "wake_at"], name="fw_run_wake"),
        ),
    ]
