"""Database defaults for the topic-settings columns added after the table (0013, 0021, 0022): an
upgrade migrates while the previous version still serves (docs/deploy.md), and that version's
inserts (setTopicConfig, pause or resume of a topic without settings yet) name none of them.
Metadata only: no row is rewritten."""

import django.contrib.postgres.fields
import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('delayqueue', '0024_settings_moves'),
    ]

    operations = [
        migrations.AlterField(
            model_name='topicconfig',
            name='draining_shards',
            field=django.contrib.postgres.fields.ArrayField(base_field=models.PositiveSmallIntegerField(), blank=True, db_default=[], default=list, editable=False, size=None),
        ),
        migrations.AlterField(
            model_name='topicconfig',
            name='push_concurrency',
            field=models.PositiveIntegerField(db_default=8, default=8, help_text='pushes in flight at once, across every pusher', validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(200)]),
        ),
        migrations.AlterField(
            model_name='topicconfig',
            name='push_previous_secret',
            field=models.CharField(blank=True, db_default='', default='', editable=False, max_length=100),
        ),
        migrations.AlterField(
            model_name='topicconfig',
            name='push_previous_until',
            field=models.BigIntegerField(db_default=0, default=0, editable=False),
        ),
        migrations.AlterField(
            model_name='topicconfig',
            name='push_rate',
            field=models.PositiveIntegerField(db_default=0, default=0, help_text='most pushes started per second; 0: no limit', validators=[django.core.validators.MaxValueValidator(1000000000)], verbose_name='push rate'),
        ),
        migrations.AlterField(
            model_name='topicconfig',
            name='push_secret',
            field=models.CharField(blank=True, db_default='', default='', editable=False, max_length=100),
        ),
        migrations.AlterField(
            model_name='topicconfig',
            name='push_timeout_millis',
            field=models.PositiveIntegerField(db_default=10000, default=10000, help_text='an attempt not answered within this long fails', validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(60000)]),
        ),
        migrations.AlterField(
            model_name='topicconfig',
            name='push_url',
            field=models.CharField(blank=True, db_default='', default='', help_text='due messages are POSTed here (docs/push.md); empty: consumers pull them', max_length=2000),
        ),
        migrations.AlterField(
            model_name='topicconfig',
            name='shard_placement',
            field=models.JSONField(blank=True, db_default={}, default=dict, editable=False),
        ),
        migrations.AlterField(
            model_name='topicconfig',
            name='shards',
            field=models.PositiveSmallIntegerField(db_default=1, default=1, help_text='Redis key sets its messages spread over, each in a slot of its own (docs/scaling.md)', validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(256)]),
        ),
        migrations.AlterField(
            model_name='topicconfig',
            name='shards_changed_at',
            field=models.BigIntegerField(db_default=0, default=0, editable=False),
        ),
    ]
