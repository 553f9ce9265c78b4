# Each natural key's new unique index is built concurrently under a name of its own, then becomes
# the constraint in the statement that drops the old one (a moment's lock): the version still
# serving keeps writing the log meanwhile, and its inserts always find a unique key to conflict on.

from django.db import migrations, models


def swap_key(table: str, name: str, columns: str) -> list[str]:
    """The statements that give `table` the unique constraint `name` on `columns` in place of its own
    (first dropping the invalid index a run interrupted while building it leaves)."""
    return [f'DROP INDEX CONCURRENTLY IF EXISTS "{name}_next"',
            f'CREATE UNIQUE INDEX CONCURRENTLY "{name}_next" ON "{table}" ({columns})',
            f'ALTER TABLE "{table}" DROP CONSTRAINT "{name}", ADD CONSTRAINT "{name}" UNIQUE USING INDEX "{name}_next"']


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('delayqueue', '0003_topichourstats'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    [*swap_key("delayqueue_message", "message_natural_key", '"msg_id", "topic", "namespace"'),
                     *swap_key("delayqueue_messageevent", "event_once", '"msg_id", "event_id", "topic", "namespace"'),
                     'DROP INDEX CONCURRENTLY IF EXISTS "message_msg_id"'],
                    reverse_sql=[
                        'CREATE INDEX CONCURRENTLY "message_msg_id" ON "delayqueue_message" ("msg_id")',
                        *swap_key("delayqueue_messageevent", "event_once",
                                  '"namespace", "topic", "msg_id", "event_id"'),
                        *swap_key("delayqueue_message", "message_natural_key", '"namespace", "topic", "msg_id"')]),
            ],
            state_operations=[
                migrations.RemoveConstraint(
                    model_name='message',
                    name='message_natural_key',
                ),
                migrations.RemoveConstraint(
                    model_name='messageevent',
                    name='event_once',
                ),
                migrations.RemoveIndex(
                    model_name='message',
                    name='message_msg_id',
                ),
                migrations.AddConstraint(
                    model_name='message',
                    constraint=models.UniqueConstraint(fields=('msg_id', 'topic', 'namespace'),
                                                       name='message_natural_key'),
                ),
                migrations.AddConstraint(
                    model_name='messageevent',
                    constraint=models.UniqueConstraint(fields=('msg_id', 'event_id', 'topic', 'namespace'),
                                                       name='event_once'),
                ),
            ],
        ),
    ]
