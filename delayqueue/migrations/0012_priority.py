from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('delayqueue', '0011_dead_letters'),
    ]

    operations = [
        migrations.AddField(
            model_name='message',
            name='priority',
            field=models.SmallIntegerField(db_default=0, default=0),
        ),
    ]
