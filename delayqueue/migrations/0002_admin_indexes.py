# Built concurrently (as every index a migration adds to the message log): the version still
# serving keeps writing the log while they are built.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('delayqueue', '0001_initial'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='message',
            index=models.Index(fields=['msg_id'], name='message_msg_id'),
        ),
        AddIndexConcurrently(
            model_name='message',
            index=models.Index(fields=['status', '-produce_time'], name='message_status_produced'),
        ),
        AddIndexConcurrently(
            model_name='message',
            index=models.Index(fields=['topic', '-produce_time'], name='message_topic_produced'),
        ),
    ]
