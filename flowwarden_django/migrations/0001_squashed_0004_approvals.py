# The tables of release 0.1.0: migrations 0001-0004, squashed (a database that applied
# them all takes this one as applied; see checks/migrations.py for one that applied
# only some).

import django.db.models.deletion
from django.db import migrations, models

from ._exact import exact_columns
from ._names import named

#: (model, column, varchar length, nullability): the text columns that MySQL/MariaDB
#: compare byte for byte (``_exact.py``), of 0001-0004 together.
EXACT_COLUMNS = [
    ('StreamCheckpoint', 'stream_name', 255, 'NOT NULL'),
    ('DeadLetter', 'stream_name', 255, 'NOT NULL'),
    ('StreamLease', 'name', 255, 'NOT NULL'),
    ('StreamLease', 'owner', 255, 'NOT NULL'),
    ('StreamWorker', 'stream_name', 255, 'NOT NULL'),
    ('StreamWorker', 'instance_id', 255, 'NOT NULL'),
    ('StreamControl', 'stream_name', 255, 'NOT NULL'),
    ('SnapshotRecord', 'id', 64, 'NOT NULL'),
    ('SnapshotRecord', 'parent_id', 64, 'NULL'),
    ('SnapshotRecord', 'coordination_id', 255, 'NOT NULL'),
    ('WorkflowRun', 'coordination_id', 255, 'NOT NULL'),
    ('WorkflowRun', 'head_snapshot_id', 64, 'NULL'),
    ('WorkflowRun', 'idempotency_key', 255, 'NULL'),
    ('Approval', 'coordination_id', 255, 'NOT NULL'),
    ('Approval', 'snapshot_id', 64, 'NOT NULL'),
    ('Approval', 'group', 150, 'NOT NULL'),
    ('Approval', 'permission', 255, 'NOT NULL'),
    ('ApprovalAssignee', 'username', 150, 'NOT NULL'),
]


class Migration(migrations.Migration):

    replaces = [
        ('flowwarden_django', '0001_initial'),
        ('flowwarden_django', '0002_stream_operations'),
        ('flowwarden_django', '0003_workflows'),
        ('flowwarden_django', '0004_approvals'),
    ]

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='StreamCheckpoint',
            fields=[
                ('stream_name', models.CharField(max_length=255, primary_key=True, serialize=False, verbose_name='stream')),
                ('instance_id', models.CharField(blank=True, max_length=255, null=True, verbose_name='instance id')),
                ('last_seen_token', models.BinaryField(null=True, verbose_name='last seen token')),
                ('last_seen_at', models.DateTimeField(null=True, verbose_name='last seen at')),
                ('last_processed_token', models.BinaryField(null=True, verbose_name='last processed token')),
                ('last_processed_at', models.DateTimeField(null=True, verbose_name='last processed at')),
                ('last_heartbeat_at', models.DateTimeField(null=True, verbose_name='last heartbeat at')),
                ('metadata', models.JSONField(blank=True, default=dict, verbose_name='metadata')),
            ],
            options=named('stream checkpoint', ordering=['stream_name']),
        ),
        migrations.CreateModel(
            name='StreamControl',
            fields=[
                ('stream_name', models.CharField(max_length=255, primary_key=True, serialize=False, verbose_name='stream')),
                ('paused', models.BooleanField(default=False, verbose_name='paused')),
                ('restart_requested_at', models.DateTimeField(blank=True, null=True, verbose_name='restart requested at')),
                ('updated_by', models.CharField(blank=True, max_length=150, verbose_name='updated by')),
                ('updated_at', models.DateTimeField(verbose_name='updated at')),
            ],
            options=named('stream control'),
        ),
        migrations.CreateModel(
            name='StreamLease',
            fields=[
                ('name', models.CharField(max_length=255, primary_key=True, serialize=False, verbose_name='name')),
                ('owner', models.CharField(blank=True, max_length=255, verbose_name='owner')),
                ('token', models.BigIntegerField(default=0, verbose_name='fencing token')),
                ('acquired_at', models.DateTimeField(blank=True, null=True, verbose_name='acquired at')),
                ('expires_at', models.DateTimeField(blank=True, null=True, verbose_name='expires at')),
            ],
            options=named('stream lease', ordering=['name']),
        ),
        migrations.CreateModel(
            name='Approval',
            fields=[
                ('id', models.UUIDField(primary_key=True, serialize=False, verbose_name='id')),
                ('coordination_id', models.CharField(max_length=255, verbose_name='coordination')),
                ('workflow_name', models.CharField(max_length=255, verbose_name='workflow')),
                ('step_name', models.CharField(max_length=255, verbose_name='step')),
                ('snapshot_id', models.CharField(max_length=64, unique=True, verbose_name='snapshot')),
                ('prompt', models.TextField(blank=True, verbose_name='prompt')),
                ('group', models.CharField(blank=True, max_length=150, verbose_name='group')),
                ('permission', models.CharField(blank=True, max_length=255, verbose_name='permission')),
                ('status', models.CharField(choices=[('pending', 'pending'), ('approved', 'approved'), ('rejected', 'rejected'), ('expired', 'expired'), ('cancelled', 'cancelled')], default='pending', max_length=16, verbose_name='status')),
                ('requested_at', models.DateTimeField(verbose_name='requested at')),
                ('expires_at', models.DateTimeField(blank=True, null=True, verbose_name='expires at')),
                ('on_expiry', models.CharField(choices=[('resume', 'resume with an expired decision'), ('fail', 'fail the run')], default='resume', max_length=8, verbose_name='on expiry')),
                ('decided_at', models.DateTimeField(blank=True, null=True, verbose_name='decided at')),
                ('comment', models.TextField(blank=True, verbose_name='comment')),
                ('payload', models.JSONField(blank=True, null=True, verbose_name='decision payload')),
                ('decided_by', models.CharField(blank=True, max_length=150, verbose_name='decided by')),
            ],
            options=named('approval', ordering=['-requested_at', 'id'], permissions=[('decide_approval', 'Can decide any approval')], indexes=[models.Index(fields=['status', 'requested_at'], name='fw_approval_status'), models.Index(fields=['coordination_id'], name='fw_approval_coordination'), models.Index(fields=['status', 'expires_at'], name='fw_approval_expiry')]),
        ),
        migrations.CreateModel(
            name='ApprovalEvent',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('action', models.CharField(choices=[('requested', 'requested'), ('approved', 'approved'), ('rejected', 'rejected'), ('expired', 'expired'), ('cancelled', 'cancelled'), ('repeated', 'same decision repeated'), ('refused', 'decision refused')], max_length=16, verbose_name='action')),
                ('actor', models.CharField(blank=True, max_length=150, verbose_name='actor')),
                ('at', models.DateTimeField(verbose_name='at')),
                ('comment', models.TextField(blank=True, verbose_name='comment')),
                ('payload', models.JSONField(blank=True, null=True, verbose_name='payload')),
                ('detail', models.TextField(blank=True, verbose_name='detail')),
                ('approval', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='events', to='flowwarden_django.approval')),
            ],
            options=named('approval event', ordering=['at', 'id']),
        ),
        migrations.CreateModel(
            name='DeadLetter',
            fields=[
                ('id', models.CharField(max_length=64, primary_key=True, serialize=False, verbose_name='id')),
                ('stream_name', models.CharField(max_length=255, verbose_name='stream')),
                ('operation_type', models.CharField(max_length=32, verbose_name='operation')),
                ('document_key', models.BinaryField(null=True, verbose_name='document key')),
                ('full_document', models.BinaryField(null=True, verbose_name='full document')),
                ('resume_token', models.BinaryField(null=True, verbose_name='resume token')),
                ('error_type', models.CharField(max_length=255, verbose_name='error type')),
                ('error_message', models.TextField(blank=True, verbose_name='error message')),
                ('stack_trace', models.TextField(blank=True, null=True, verbose_name='stack trace')),
                ('attempts', models.PositiveIntegerField(default=1, verbose_name='attempts')),
                ('status', models.CharField(choices=[('PENDING', 'pending'), ('REPLAYING', 'replaying'), ('REPLAYED', 'replayed'), ('ACKNOWLEDGED', 'acknowledged'), ('DISCARDED', 'discarded')], default='PENDING', max_length=16, verbose_name='status')),
                ('first_attempt_at', models.DateTimeField(verbose_name='first attempt at')),
                ('last_attempt_at', models.DateTimeField(verbose_name='last attempt at')),
                ('created_at', models.DateTimeField(verbose_name='created at')),
                ('expires_at', models.DateTimeField(blank=True, null=True, verbose_name='expires at')),
                ('metadata', models.JSONField(blank=True, default=dict, verbose_name='metadata')),
                ('replay_count', models.PositiveIntegerField(default=0, verbose_name='replays')),
                ('last_replayed_at', models.DateTimeField(blank=True, null=True, verbose_name='last replayed at')),
                ('resolved_at', models.DateTimeField(blank=True, null=True, verbose_name='resolved at')),
                ('resolved_by', models.CharField(blank=True, max_length=150, verbose_name='resolved by')),
                ('note', models.TextField(blank=True, verbose_name='note')),
            ],
            options=named('dead letter', ordering=['-created_at', 'id'], permissions=[('replay_deadletter', 'Can replay dead letters'), ('resolve_deadletter', 'Can acknowledge or discard dead letters')], indexes=[models.Index(fields=['stream_name', 'status'], name='fw_dlq_stream_status'), models.Index(fields=['expires_at'], name='fw_dlq_expires')]),
        ),
        migrations.CreateModel(
            name='SnapshotRecord',
            fields=[
                ('id', models.CharField(max_length=64, primary_key=True, serialize=False, verbose_name='id')),
                ('parent_id', models.CharField(blank=True, max_length=64, null=True, verbose_name='parent')),
                ('coordination_id', models.CharField(max_length=255, verbose_name='coordination')),
                ('seq', models.BigIntegerField(verbose_name='sequence')),
                ('agent_name', models.CharField(blank=True, max_length=255, null=True, verbose_name='agent')),
                ('state', models.TextField(blank=True, null=True, verbose_name='state')),
                ('state_type', models.CharField(blank=True, max_length=255, verbose_name='state type')),
                ('metadata', models.TextField(blank=True, verbose_name='metadata')),
                ('created_at', models.DateTimeField(verbose_name='created at')),
            ],
            options=named('workflow snapshot', ordering=['coordination_id', 'seq'], indexes=[models.Index(fields=['created_at'], name='fw_snapshot_created'), models.Index(fields=['agent_name'], name='fw_snapshot_agent'), models.Index(fields=['parent_id'], name='fw_snapshot_parent')], constraints=[models.UniqueConstraint(fields=('coordination_id', 'seq'), name='fw_snapshot_coordination_seq')]),
        ),
        migrations.CreateModel(
            name='StreamWorker',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('stream_name', models.CharField(max_length=255, verbose_name='stream')),
                ('instance_id', models.CharField(max_length=255, verbose_name='instance')),
                ('state', models.CharField(max_length=16, verbose_name='state')),
                ('role', models.CharField(blank=True, max_length=16, verbose_name='role')),
                ('started_at', models.DateTimeField(blank=True, null=True, verbose_name='started at')),
                ('last_event_at', models.DateTimeField(blank=True, null=True, verbose_name='last event at')),
                ('events', models.BigIntegerField(default=0, verbose_name='events')),
                ('errors', models.BigIntegerField(default=0, verbose_name='errors')),
                ('retries', models.BigIntegerField(default=0, verbose_name='retries')),
                ('dead_lettered', models.BigIntegerField(default=0, verbose_name='dead-lettered')),
                ('restarts', models.BigIntegerField(default=0, verbose_name='restarts')),
                ('last_error', models.TextField(blank=True, verbose_name='last error')),
                ('updated_at', models.DateTimeField(verbose_name='updated at')),
            ],
            options=named('stream worker', ordering=['stream_name', 'instance_id'], permissions=[('control_stream', 'Can start, stop and restart streams')], constraints=[models.UniqueConstraint(fields=('stream_name', 'instance_id'), name='fw_stream_worker_unique')]),
        ),
        migrations.CreateModel(
            name='WorkflowRun',
            fields=[
                ('coordination_id', models.CharField(max_length=255, primary_key=True, serialize=False, verbose_name='coordination')),
                ('workflow_name', models.CharField(max_length=255, verbose_name='workflow')),
                ('status', models.CharField(choices=[('running', 'running'), ('hibernated', 'hibernated'), ('waiting', 'waiting for approval'), ('completed', 'completed'), ('failed', 'failed')], default='running', max_length=16, verbose_name='status')),
                ('last_step', models.CharField(blank=True, max_length=255, verbose_name='last step')),
                ('head_snapshot_id', models.CharField(blank=True, max_length=64, null=True, verbose_name='head snapshot')),
                ('idempotency_key', models.CharField(blank=True, max_length=255, null=True, unique=True, verbose_name='idempotency key')),
                ('failure_reason', models.TextField(blank=True, verbose_name='failure reason')),
                ('resume_input', models.JSONField(blank=True, null=True, verbose_name='resume input')),
                ('runner', models.CharField(blank=True, max_length=255, verbose_name='runner')),
                ('claimed_until', models.DateTimeField(blank=True, null=True, verbose_name='claimed until')),
                ('attempts', models.PositiveIntegerField(default=0, verbose_name='attempts')),
                ('created_at', models.DateTimeField(verbose_name='created at')),
                ('updated_at', models.DateTimeField(verbose_name='updated at')),
            ],
            options=named('workflow run', ordering=['-updated_at'], permissions=[('fork_workflowrun', 'Can fork a workflow run from a snapshot')], indexes=[models.Index(fields=['status', 'updated_at'], name='fw_run_status')]),
        ),
        migrations.CreateModel(
            name='ApprovalAssignee',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('username', models.CharField(max_length=150, verbose_name='username')),
                ('approval', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='assignments', to='flowwarden_django.approval')),
            ],
            options=named('approval assignee', indexes=[models.Index(fields=['username'], name='fw_assignee_username')], constraints=[models.UniqueConstraint(fields=('approval', 'username'), name='fw_approval_assignee')]),
        ),
        migrations.RunPython(exact_columns(EXACT_COLUMNS), migrations.RunPython.noop, atomic=False),
    ]
