from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("shop", "0003_order_copied"),
    ]

    operations = [
        migrations.AddField(
            model_name="order",
            name="payment",
            field=models.CharField(blank=True, default="", max_length=20),
        ),
        migrations.AddField(
            model_name="order",
            name="paid_cents",
            field=models.IntegerField(default=0),
        ),
    ]
