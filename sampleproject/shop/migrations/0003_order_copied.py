from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("shop", "0002_order_approval"),
    ]

    operations = [
        migrations.AddField(
            model_name="order",
            name="copied",
            field=models.BooleanField(default=False),
        ),
        migrations.AlterModelOptions(
            name="order",
            options={
                "ordering": ["order_id"],
                "permissions": [
                    ("start_order_workflow", "Can start an order's approval workflow")
                ],
            },
        ),
    ]
