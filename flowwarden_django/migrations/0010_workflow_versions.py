# Workflow versions (issue 30): each run records the version of its workflow's
# definition it started on, and a run the deployed code cannot continue (its version,
# or the step it stands after, is not defined) waits as "needs upgrade" instead of
# starting over. Existing runs are on version 1, the default of Workflow.define.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("flowwarden_django", "0009_search_indexes")]

    operations = [
        migrations.AlterModelOptions(
            name="workflowrun",
            options={
                "ordering": ["-updated_at"],
                "permissions": [
                    ("fork_workflowrun", "Can fork a workflow run from a snapshot"),
                    ("upgrade_workflowrun", "Can upgrade workflow runs to another version"),
                ],
                "verbose_name": "workflow run",
                "verbose_name_plural": "workflow runs",
            },
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="workflow_version",
            field=models.PositiveIntegerField(db_default=1, default=1, verbose_name="version"),
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
                ],
                default="running",
                max_length=16,
                verbose_name="status",
            ),
        ),
    ]
