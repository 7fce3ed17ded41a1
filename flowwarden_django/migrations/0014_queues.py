# Queues (issue 48): the status "waiting_slot", a run's queue, partition, priority and
# place (queued_at), and the slots that hold each queue's concurrency and rate.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('flowwarden_django', '0013_messages_events'),
    ]

    operations = [
        migrations.CreateModel(
            name='WorkflowQueueSlot',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('queue', models.CharField(max_length=100, verbose_name='queue')),
                ('partition', models.CharField(blank=True, default='', max_length=255, verbose_name='partition')),
                ('kind', models.CharField(choices=[('concurrency', 'concurrency'), ('rate', 'rate')], max_length=12, verbose_name='kind')),
                ('number', models.PositiveIntegerField(verbose_name='number')),
                ('holder', models.CharField(blank=True, default='', max_length=255, verbose_name='held by run')),
                ('token', models.CharField(blank=True, default='', max_length=64, verbose_name='token')),
                ('held_until', models.DateTimeField(blank=True, null=True, verbose_name='held until')),
            ],
            options={
                'verbose_name': 'workflow queue slot',
                'verbose_name_plural': 'workflow queue slots',
            },
        ),
        migrations.AddField(
            model_name='workflowrun',
            name='queue',
            field=models.CharField(blank=True, db_default='', default='', max_length=100, verbose_name='queue'),
        ),
        migrations.AddField(
            model_name='workflowrun',
            name='queue_partition',
            field=models.CharField(blank=True, db_default='', default='', max_length=255, verbose_name='queue partition'),
        ),
        migrations.AddField(
            model_name='workflowrun',
            name='queue_priority',
            field=models.IntegerField(db_default=0, default=0, verbose_name='priority'),
        ),
        migrations.AddField(
            model_name='workflowrun',
            name='queued_at',
            field=models.DateTimeField(blank=True, null=True, verbose_name='queued at'),
        ),
        migrations.AlterField(
            model_name='workflowrun',
            name='status',
            field=models.CharField(choices=[('running', 'running'), ('hibernated', 'hibernated'), ('waiting', 'waiting for approval'), ('completed', 'completed'), ('failed', 'failed'), ('needs_upgrade', 'needs upgrade'), ('sleeping', 'sleeping'), ('waiting_children', 'waiting for child runs'), ('cancelled', 'cancelled'), ('waiting_message', 'waiting for a message'), ('waiting_slot', 'waiting for a slot')], default='running', max_length=16, verbose_name='status'),
        ),
        migrations.AddIndex(
            model_name='workflowrun',
            index=models.Index(fields=['status', 'queue', 'queue_partition', 'queue_priority', 'queued_at'], name='fw_run_queued'),
        ),
        migrations.AddConstraint(
            model_name='workflowqueueslot',
            constraint=models.UniqueConstraint(fields=('queue', 'partition', 'kind', 'number'), name='fw_queue_slot_unique'),
        ),
    ]
