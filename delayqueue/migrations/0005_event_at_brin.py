# The BRIN index is built concurrently under a name of its own and takes event_at's name once the
# old one is gone: the version still serving keeps writing the history meanwhile.

import django.contrib.postgres.indexes
from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('delayqueue', '0004_natural_keys_msg_id_first'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='messageevent',
            index=django.contrib.postgres.indexes.BrinIndex(autosummarize=True, fields=['at'], name='event_at_brin'),
        ),
        RemoveIndexConcurrently(
            model_name='messageevent',
            name='event_at',
        ),
        migrations.RenameIndex(
            model_name='messageevent',
            new_name='event_at',
            old_name='event_at_brin',
        ),
    ]
