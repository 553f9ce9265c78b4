# message_dead is built concurrently: the version still serving keeps writing the log meanwhile.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('delayqueue', '0010_topicconfig'),
    ]

    operations = [
        migrations.CreateModel(
            name='RedriveTask',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('namespace', models.CharField(max_length=128)),
                ('topic', models.CharField(max_length=255)),
                ('msg_ids', models.JSONField(blank=True, help_text='only these msgIds; null: every dead letter', null=True)),
                ('max_per_second', models.PositiveIntegerField()),
                ('created_at', models.DateTimeField()),
                ('after_time', models.DateTimeField(blank=True, null=True)),
                ('after_id', models.BigIntegerField(default=0)),
                ('moved', models.BigIntegerField(default=0)),
                ('sending', models.JSONField(blank=True, null=True)),
                ('done_at', models.DateTimeField(blank=True, null=True)),
                ('lease_owner', models.CharField(blank=True, max_length=200)),
                ('lease_until', models.DateTimeField(blank=True, null=True)),
            ],
        ),
        AddIndexConcurrently(
            model_name='message',
            index=models.Index(condition=models.Q(('status', 6)), fields=['namespace', 'topic', 'updated_at', 'id'], name='message_dead'),
        ),
        migrations.AddIndex(
            model_name='redrivetask',
            index=models.Index(condition=models.Q(('done_at__isnull', True)), fields=['namespace', 'id'], name='redrive_running'),
        ),
    ]
