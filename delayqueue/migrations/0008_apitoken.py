from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('delayqueue', '0007_limits'),
    ]

    operations = [
        migrations.CreateModel(
            name='ApiToken',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=100, unique=True)),
                ('namespace', models.CharField(max_length=64)),
                ('scopes', models.CharField(help_text='comma-separated: produce, consume, manage, monitor', max_length=100)),
                ('token_hash', models.CharField(editable=False, max_length=64, unique=True, verbose_name='token sha256')),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('revoked_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'verbose_name': 'API token',
            },
        ),
    ]
