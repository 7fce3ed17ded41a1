# Indexes of the listings at scale (issue 14, part 3): each list's order, so that a
# page is an index range whatever the table holds.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('flowwarden_django', '0007_stream_initial_sync'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='snapshotrecord',
            index=models.Index(fields=['coordination_id', 'created_at', 'seq'], name='fw_snapshot_run_created'),
        ),
        migrations.AddIndex(
            model_name='workflowrun',
            index=models.Index(fields=['-updated_at', 'coordination_id'], name='fw_run_updated'),
        ),
        migrations.AddIndex(
            model_name='approval',
            index=models.Index(fields=['-requested_at', 'id'], name='fw_approval_requested'),
        ),
        migrations.AddIndex(
            model_name='approval',
            index=models.Index(fields=['workflow_name', '-requested_at', 'id'], name='fw_approval_workflow'),
        ),
    ]
