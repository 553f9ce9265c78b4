# The new message_dead is built concurrently under a name of its own and takes the name once the
# old one is gone: the version still serving keeps writing the log, and finding its dead letters
# through an index, meanwhile.

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('delayqueue', '0017_limit_set_by_operator'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='message',
            index=models.Index(condition=models.Q(('status__in', (5, 6))),
                               fields=['namespace', 'topic', 'updated_at', 'id'], name='message_dead_next'),
        ),
        RemoveIndexConcurrently(
            model_name='message',
            name='message_dead',
        ),
        migrations.RenameIndex(
            model_name='message',
            new_name='message_dead',
            old_name='message_dead_next',
        ),
    ]
