"""Limits and topic settings carry the transaction that last wrote them, and deleted rows leave a
mark, so that every process reads twice a second only what changed (stores/refreshed.py)."""
from django.db import migrations

from delayqueue.messagelog import sql


class Migration(migrations.Migration):

    dependencies = [
        ('delayqueue', '0014_table_names_from_messagelog_tables'),
    ]

    operations = [
        migrations.RunSQL(sql.SETTINGS_CHANGES, reverse_sql=sql.SETTINGS_CHANGES_UNDONE),
    ]
