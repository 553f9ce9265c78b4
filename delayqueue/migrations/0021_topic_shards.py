import django.contrib.postgres.fields
import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('delayqueue', '0020_schedules'),
    ]

    operations = [
        migrations.AddField(
            model_name='topicconfig',
            name='shards',
            field=models.PositiveSmallIntegerField(default=1, help_text='Redis key sets its messages spread over, each in a slot of its own (docs/scaling.md)', validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(256)]),
        ),
        migrations.AddField(
            model_name='topicconfig',
            name='draining_shards',
            field=django.contrib.postgres.fields.ArrayField(base_field=models.PositiveSmallIntegerField(), blank=True, default=list, editable=False, size=None),
        ),
        migrations.AddField(
            model_name='topicconfig',
            name='shards_changed_at',
            field=models.BigIntegerField(default=0, editable=False),
        ),
    ]
