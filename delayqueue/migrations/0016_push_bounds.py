"""Lower push bounds (core/constants.py): 200 pushes in flight per topic, 60 s per attempt; no SQL runs."""

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('delayqueue', '0015_settings_changes'),
    ]

    operations = [
        migrations.AlterField(
            model_name='topicconfig',
            name='push_concurrency',
            field=models.PositiveIntegerField(default=8, help_text='pushes in flight at once, across every pusher', validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(200)]),
        ),
        migrations.AlterField(
            model_name='topicconfig',
            name='push_timeout_millis',
            field=models.PositiveIntegerField(default=10000, help_text='an attempt not answered within this long fails', validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(60000)]),
        ),
    ]
