"""When Redis began a log row's life (Message.started_us), for a send's late correction not to take the row
back to an earlier life. A nullable column without a default: PostgreSQL changes its catalogue only (no row is
rewritten), and the version still serving during an upgrade writes its rows without it (unknown, as a row
written before Redis answered)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('delayqueue', '0026_event_times'),
    ]

    operations = [
        migrations.AddField(
            model_name='message',
            name='started_us',
            field=models.BigIntegerField(blank=True, null=True),
        ),
    ]
