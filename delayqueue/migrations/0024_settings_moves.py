"""A limit or topic-settings row given another topic leaves a deletion mark for the one it had, so
that every process takes the old topic's settings out of force at its next refresh (stores/refreshed.py)."""
from django.db import migrations

from delayqueue.messagelog import sql


class Migration(migrations.Migration):

    dependencies = [
        ('delayqueue', '0023_historypruned'),
    ]

    operations = [
        migrations.RunSQL(sql.SETTINGS_MOVES, reverse_sql=sql.SETTINGS_MOVES_UNDONE),
    ]
