# What came after release 0.1.0: migrations 0005-0008 and 0010-0016, squashed
# (0009's trigram indexes, built outside a transaction, are 0017). A database that
# applied them all takes this one as applied; see checks/migrations.py for one that
# applied only some.
#
# The fields, indexes and changed field definitions on 0.1.0's tables are listed in
# the tables below, one line each, in the order the operations apply them.

import django.db.models.deletion
from django.db import migrations, models

from ._names import named

#: (model, field name, field): the columns added to 0.1.0's tables.
ADDED_FIELDS = [
    ('streamworker', 'error_kind', models.CharField(blank=True, max_length=255, verbose_name='error kind')),
    ('streamworker', 'restarting_since', models.DateTimeField(blank=True, null=True, verbose_name='restarting since')),
    ('streamcheckpoint', 'initial_sync', models.JSONField(blank=True, null=True, verbose_name='initial sync')),
    ('streamcheckpoint', 'initial_sync_batch', models.BigIntegerField(blank=True, null=True, verbose_name='initial sync batch')),
    ('workflowrun', 'workflow_version', models.PositiveIntegerField(db_default=1, default=1, verbose_name='version')),
    ('workflowrun', 'parent_coordination_id', models.CharField(blank=True, db_index=True, max_length=255, null=True, verbose_name='parent run')),
    ('workflowrun', 'step_errors', models.JSONField(blank=True, editable=False, null=True, verbose_name='step errors')),
    ('workflowrun', 'wake_at', models.DateTimeField(blank=True, null=True, verbose_name='wakes at')),
    ('streamworker', 'in_flight', models.IntegerField(default=0, verbose_name='in flight')),
    ('streamworker', 'parked_keys', models.JSONField(blank=True, default=list, verbose_name='parked keys')),
    ('streamworker', 'watermark_lag', models.IntegerField(default=0, verbose_name='watermark lag')),
    ('workflowrun', 'waiting_topic', models.CharField(blank=True, db_default='', default='', max_length=255, verbose_name='waiting for topic')),
    ('workflowrun', 'queue', models.CharField(blank=True, db_default='', default='', max_length=100, verbose_name='queue')),
    ('workflowrun', 'queue_partition', models.CharField(blank=True, db_default='', default='', max_length=255, verbose_name='queue partition')),
    ('workflowrun', 'queue_priority', models.IntegerField(db_default=0, default=0, verbose_name='priority')),
    ('workflowrun', 'queued_at', models.DateTimeField(blank=True, null=True, verbose_name='queued at')),
    ('approval', 'claimed_at', models.DateTimeField(blank=True, null=True, verbose_name='claimed at')),
    ('approval', 'claimed_by', models.CharField(blank=True, db_default='', default='', max_length=150, verbose_name='claimed by')),
    ('approval', 'escalate_at', models.DateTimeField(blank=True, null=True, verbose_name='escalates at')),
    ('approval', 'escalate_to_group', models.CharField(blank=True, db_default='', default='', max_length=150, verbose_name='escalates to group')),
    ('approval', 'escalate_to_users', models.JSONField(blank=True, null=True, verbose_name='escalates to users')),
    ('approval', 'escalated_at', models.DateTimeField(blank=True, null=True, verbose_name='escalated at')),
    ('approval', 'form', models.CharField(blank=True, db_default='', default='', max_length=255, verbose_name='form')),
    ('approval', 'form_initial', models.JSONField(blank=True, null=True, verbose_name='form initial data')),
    ('approval', 'next_reminder_at', models.DateTimeField(blank=True, null=True, verbose_name='next reminder at')),
    ('approval', 'remind_every', models.DurationField(blank=True, null=True, verbose_name='remind every')),
    ('approval', 'reminders_sent', models.PositiveIntegerField(db_default=0, default=0, verbose_name='reminders sent')),
]

#: (model, field name, field): definitions changed without a change of column
#: (choices, labels).
ALTERED_FIELDS = [
    ('workflowrun', 'attempts', models.PositiveIntegerField(default=0, verbose_name='retries')),
    ('workflowrun', 'status', models.CharField(choices=[('running', 'running'), ('hibernated', 'hibernated'), ('waiting', 'waiting for approval'), ('completed', 'completed'), ('failed', 'failed'), ('needs_upgrade', 'needs upgrade'), ('sleeping', 'sleeping'), ('waiting_children', 'waiting for child runs'), ('cancelled', 'cancelled'), ('waiting_message', 'waiting for a message'), ('waiting_slot', 'waiting for a slot')], default='running', max_length=16, verbose_name='status')),
    ('approvalevent', 'action', models.CharField(choices=[('requested', 'requested'), ('approved', 'approved'), ('rejected', 'rejected'), ('expired', 'expired'), ('cancelled', 'cancelled'), ('repeated', 'same decision repeated'), ('refused', 'decision refused'), ('claimed', 'claimed'), ('released', 'released'), ('reassigned', 'reassigned'), ('reminded', 'reminder sent'), ('escalated', 'escalated')], max_length=16, verbose_name='action')),
]

#: (model, index): the indexes added to 0.1.0's tables.
ADDED_INDEXES = [
    ('snapshotrecord', models.Index(fields=['coordination_id', 'created_at', 'seq'], name='fw_snapshot_run_created')),
    ('workflowrun', models.Index(fields=['-updated_at', 'coordination_id'], name='fw_run_updated')),
    ('approval', models.Index(fields=['-requested_at', 'id'], name='fw_approval_requested')),
    ('approval', models.Index(fields=['workflow_name', '-requested_at', 'id'], name='fw_approval_workflow')),
    ('workflowrun', models.Index(fields=['status', 'wake_at'], name='fw_run_wake')),
    ('workflowrun', models.Index(fields=['status', 'queue', 'queue_partition', 'queue_priority', 'queued_at'], name='fw_run_queued')),
    ('approval', models.Index(fields=['status', 'next_reminder_at'], name='fw_approval_remind')),
    ('approval', models.Index(fields=['status', 'escalate_at'], name='fw_approval_escalate')),
]


class Migration(migrations.Migration):

    replaces = [
        ('flowwarden_django', '0005_worker_restart_reason'),
        ('flowwarden_django', '0006_run_retries'),
        ('flowwarden_django', '0007_stream_initial_sync'),
        ('flowwarden_django', '0008_listing_indexes'),
        ('flowwarden_django', '0010_workflow_versions'),
        ('flowwarden_django', '0011_sleep_cancel_children_timings'),
        ('flowwarden_django', '0012_parallel_streams'),
        ('flowwarden_django', '0013_messages_events'),
        ('flowwarden_django', '0014_queues'),
        ('flowwarden_django', '0015_human_tasks'),
        ('flowwarden_django', '0016_defined_workflows'),
    ]

    dependencies = [
        ('flowwarden_django', '0001_squashed_0004_approvals'),
    ]

    operations = [
        migrations.CreateModel(
            name='StreamSettledEvent',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('stream_name', models.CharField(max_length=255, verbose_name='stream')),
                ('event_digest', models.CharField(max_length=64, verbose_name='event digest')),
                ('settled_at', models.DateTimeField(auto_now_add=True, verbose_name='settled at')),
            ],
            options=named('settled stream event', constraints=[models.UniqueConstraint(fields=('stream_name', 'event_digest'), name='fw_settled_event_once')]),
        ),
        migrations.CreateModel(
            name='WorkflowEvent',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('coordination_id', models.CharField(max_length=255, verbose_name='coordination')),
                ('key', models.CharField(max_length=255, verbose_name='key')),
                ('value', models.JSONField(blank=True, null=True, verbose_name='value')),
                ('updated_at', models.DateTimeField(verbose_name='updated at')),
            ],
            options=named('workflow event', ordering=['coordination_id', 'key'], constraints=[models.UniqueConstraint(fields=('coordination_id', 'key'), name='fw_event_key')]),
        ),
        migrations.CreateModel(
            name='WorkflowMessage',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('coordination_id', models.CharField(max_length=255, verbose_name='coordination')),
                ('topic', models.CharField(max_length=255, verbose_name='topic')),
                ('payload', models.JSONField(verbose_name='payload')),
                ('sender', models.CharField(blank=True, max_length=255, verbose_name='sender')),
                ('sent_at', models.DateTimeField(verbose_name='sent at')),
                ('idempotency_key', models.CharField(blank=True, max_length=255, null=True, verbose_name='idempotency key')),
                ('delivered_to', models.CharField(blank=True, max_length=64, null=True, unique=True, verbose_name='delivered to snapshot')),
                ('delivered_at', models.DateTimeField(blank=True, null=True, verbose_name='delivered at')),
            ],
            options=named('workflow message', ordering=['coordination_id', 'id'], indexes=[models.Index(fields=['coordination_id', 'topic', 'delivered_to', 'id'], name='fw_message_mailbox')], constraints=[models.UniqueConstraint(fields=('coordination_id', 'idempotency_key'), name='fw_message_key')]),
        ),
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
            options=named('workflow queue slot', constraints=[models.UniqueConstraint(fields=('queue', 'partition', 'kind', 'number'), name='fw_queue_slot_unique')]),
        ),
        migrations.CreateModel(
            name='ApprovalNotification',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('event', models.CharField(choices=[('requested', 'requested'), ('assigned', 'assigned'), ('reminded', 'reminder'), ('escalated', 'escalated')], max_length=16, verbose_name='event')),
                ('number', models.PositiveIntegerField(default=0, verbose_name='number')),
                ('recipients', models.JSONField(default=list, verbose_name='recipients')),
                ('created_at', models.DateTimeField(verbose_name='created at')),
                ('sending_at', models.DateTimeField(blank=True, null=True, verbose_name='sending at')),
                ('sent_at', models.DateTimeField(blank=True, null=True, verbose_name='sent at')),
                ('error', models.TextField(blank=True, verbose_name='error')),
                ('approval', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='notifications', to='flowwarden_django.approval')),
            ],
            options=named('approval notification', constraints=[models.UniqueConstraint(fields=('approval', 'event', 'number'), name='fw_approval_notification_once')]),
        ),
        migrations.CreateModel(
            name='DefinedWorkflow',
            fields=[
            ],
            options=named('workflow', proxy=True, default_permissions=(), indexes=[], constraints=[]),
            bases=('flowwarden_django.workflowrun',),
        ),
        migrations.AlterModelOptions(
            name='approval',
            options=named('approval', ordering=['-requested_at', 'id'], permissions=[('decide_approval', 'Can decide any approval'), ('reassign_approval', 'Can reassign approvals')]),
        ),
        migrations.AlterModelOptions(
            name='workflowrun',
            options=named('workflow run', ordering=['-updated_at'], permissions=[('fork_workflowrun', 'Can fork a workflow run from a snapshot'), ('upgrade_workflowrun', 'Can upgrade workflow runs to another version'), ('cancel_workflowrun', 'Can cancel workflow runs'), ('send_message_workflowrun', 'Can send messages to workflow runs')]),
        ),
        *(migrations.AddField(model, name, field) for model, name, field in ADDED_FIELDS),
        *(migrations.AlterField(model, name, field) for model, name, field in ALTERED_FIELDS),
        *(migrations.AddIndex(model, index) for model, index in ADDED_INDEXES),
    ]
