"""What a change in Redis was, on its history row: the life it was of (MessageEvent.produce_time) and
the times it moved (trigger_time, expire_time), for a send's correction to catch up on them. Nullable
columns without a default: PostgreSQL changes its catalogue only (no row is rewritten), and the
version still serving during an upgrade writes its rows without them."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('delayqueue', '0025_topic_config_db_defaults'),
    ]

    operations = [
        migrations.AddField(
            model_name='messageevent',
            name='expire_time',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='messageevent',
            name='trigger_time',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='messageevent',
            name='produce_time',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
