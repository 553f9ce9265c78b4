"""The models name their tables from messagelog/tables.py, the names they always had: no SQL runs."""
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('delayqueue', '0013_push'),
    ]

    operations = [
        migrations.AlterModelTable(
            name='apitoken',
            table='delayqueue_apitoken',
        ),
        migrations.AlterModelTable(
            name='limit',
            table='delayqueue_limit',
        ),
        migrations.AlterModelTable(
            name='message',
            table='delayqueue_message',
        ),
        migrations.AlterModelTable(
            name='messageevent',
            table='delayqueue_messageevent',
        ),
        migrations.AlterModelTable(
            name='redrivetask',
            table='delayqueue_redrivetask',
        ),
        migrations.AlterModelTable(
            name='topicconfig',
            table='delayqueue_topicconfig',
        ),
        migrations.AlterModelTable(
            name='topichourstats',
            table='delayqueue_topichourstats',
        ),
    ]
