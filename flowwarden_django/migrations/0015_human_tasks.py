# Human tasks (issue 49): typed decision forms, claims, reminders and escalation on
# approvals, the reassign permission, the new audit actions, and the notifications
# outbox (one row per event, so nothing is notified twice).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('flowwarden_django', '0014_queues'),
    ]

    operations = [
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
            ],
            options={
                'verbose_name': 'approval notification',
                'verbose_name_plural': 'approval notifications',
            },
        ),
        migrations.AlterModelOptions(
            name='approval',
            options={'ordering': ['-requested_at', 'id'], 'permissions': [('decide_approval', 'Can decide any approval'), ('reassign_approval', 'Can reassign approvals')], 'verbose_name': 'approval', 'verbose_name_plural': 'approvals'},
        ),
        migrations.AddField(
            model_name='approval',
            name='claimed_at',
            field=models.DateTimeField(blank=True, null=True, verbose_name='claimed at'),
        ),
        migrations.AddField(
            model_name='approval',
            name='claimed_by',
            field=models.CharField(blank=True, db_default='', default='', max_length=150, verbose_name='claimed by'),
        ),
        migrations.AddField(
            model_name='approval',
            name='escalate_at',
            field=models.DateTimeField(blank=True, null=True, verbose_name='escalates at'),
        ),
        migrations.AddField(
            model_name='approval',
            name='escalate_to_group',
            field=models.CharField(blank=True, db_default='', default='', max_length=150, verbose_name='escalates to group'),
        ),
        migrations.AddField(
            model_name='approval',
            name='escalate_to_users',
            field=models.JSONField(blank=True, null=True, verbose_name='escalates to users'),
        ),
        migrations.AddField(
            model_name='approval',
            name='escalated_at',
            field=models.DateTimeField(blank=True, null=True, verbose_name='escalated at'),
        ),
        migrations.AddField(
            model_name='approval',
            name='form',
            field=models.CharField(blank=True, db_default='', default='', max_length=255, verbose_name='form'),
        ),
        migrations.AddField(
            model_name='approval',
            name='form_initial',
            field=models.JSONField(blank=True, null=True, verbose_name='form initial data'),
        ),
        migrations.AddField(
            model_name='approval',
            name='next_reminder_at',
            field=models.DateTimeField(blank=True, null=True, verbose_name='next reminder at'),
        ),
        migrations.AddField(
            model_name='approval',
            name='remind_every',
            field=models.DurationField(blank=True, null=True, verbose_name='remind every'),
        ),
        migrations.AddField(
            model_name='approval',
            name='reminders_sent',
            field=models.PositiveIntegerField(db_default=0, default=0, verbose_name='reminders sent'),
        ),
        migrations.AlterField(
            model_name='approvalevent',
            name='action',
            field=models.CharField(choices=[('requested', 'requested'), ('approved', 'approved'), ('rejected', 'rejected'), ('expired', 'expired'), ('cancelled', 'cancelled'), ('repeated', 'same decision repeated'), ('refused', 'decision refused'), ('claimed', 'claimed'), ('released', 'released'), ('reassigned', 'reassigned'), ('reminded', 'reminder sent'), ('escalated', 'escalated')], max_length=16, verbose_name='action'),
        ),
        migrations.AddIndex(
            model_name='approval',
            index=models.Index(fields=['status', 'next_reminder_at'], name='fw_approval_remind'),
        ),
        migrations.AddIndex(
            model_name='approval',
            index=models.Index(fields=['status', 'escalate_at'], name='fw_approval_escalate'),
        ),
        migrations.AddField(
            model_name='approvalnotification',
            name='approval',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='notifications', to='flowwarden_django.approval'),
        ),
        migrations.AddConstraint(
            model_name='approvalnotification',
            constraint=models.UniqueConstraint(fields=('approval', 'event', 'number'), name='fw_approval_notification_once'),
        ),
    ]
