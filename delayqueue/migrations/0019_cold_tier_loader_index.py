# Built concurrently: a log of millions of rows keeps taking sends while it is.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('delayqueue', '0018_expired_dead_letters'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='message',
            index=models.Index(condition=models.Q(('status', 1)), fields=['namespace', 'topic', 'trigger_time', 'id'], name='message_waiting'),
        ),
    ]
