from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('delayqueue', '0022_topic_shard_placement'),
    ]

    operations = [
        migrations.CreateModel(
            name='HistoryPruned',
            fields=[
                ('namespace', models.CharField(max_length=128, primary_key=True, serialize=False)),
                ('before', models.DateTimeField()),
            ],
            options={
                'verbose_name_plural': 'history pruned',
                'db_table': 'delayqueue_historypruned',
            },
        ),
    ]
