# Topics as camellia accepts them, up to 255 bytes (delayqueue/topics.py). Widening a varchar
# changes only the catalog in PostgreSQL: no table is rewritten, no index rebuilt.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('delayqueue', '0005_event_at_brin'),
    ]

    operations = [
        migrations.AlterField(
            model_name='message',
            name='topic',
            field=models.CharField(max_length=255),
        ),
        migrations.AlterField(
            model_name='messageevent',
            name='topic',
            field=models.CharField(max_length=255),
        ),
        migrations.AlterField(
            model_name='topichourstats',
            name='topic',
            field=models.CharField(max_length=255),
        ),
    ]
