from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('delayqueue', '0021_topic_shards'),
    ]

    operations = [
        migrations.AddField(
            model_name='topicconfig',
            name='shard_placement',
            field=models.JSONField(blank=True, default=dict, editable=False),
        ),
    ]
