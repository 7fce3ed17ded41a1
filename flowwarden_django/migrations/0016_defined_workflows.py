# The admin's "Workflows" page (issue 50): a proxy of WorkflowRun, no table.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('flowwarden_django', '0015_human_tasks'),
    ]

    operations = [
        migrations.CreateModel(
            name='DefinedWorkflow',
            fields=[],
            options={
                'verbose_name': 'workflow',
                'verbose_name_plural': 'workflows',
                'proxy': True,
                'default_permissions': (),
                'indexes': [],
                'constraints': [],
            },
            bases=('flowwarden_django.workflowrun',),
        ),
    ]
