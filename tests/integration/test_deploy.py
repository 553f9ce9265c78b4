"""docs/deploy.md's settings are complete: with exactly the two environment files it shows (each
`<...>` filled in), `manage.py check --deploy` reports nothing; without them it does (so the
check is not vacuous). Its upgrades migrate while the previous version still serves: that
version's writes still go in."""
import io
import os
import re
import secrets
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.operations import AddField
from django.db.models import NOT_PROVIDED
from django.utils import timezone

from tests.helpers import ROOT

pytestmark = pytest.mark.process

ENV_FILES = ("/etc/delayqueue/delayqueue.env", "/etc/delayqueue/secrets.env")


def documented_environment() -> dict[str, str]:
    """The variables of the doc's environment-file blocks, placeholders filled with random text."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    env: dict[str, str] = {}
    for name in ENV_FILES:
        block = re.search(rf"```sh\n# {re.escape(name)} [^\n]*\n(.*?)```", text, re.S)
        assert block, f"docs/deploy.md shows no {name} block"
        for line in block.group(1).splitlines():
            key, _, value = line.partition("=")
            env[key] = re.sub(r"<[^>]*>", lambda _: secrets.token_urlsafe(40), value)
    return env


def check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], cwd=ROOT,
                          env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True, timeout=120)


def test_the_documented_settings_pass_manage_py_check_deploy():
    env = documented_environment()
    assert {"SECRET_KEY", "REDIS_URL", "DATABASE_URL", "ALLOWED_HOSTS"} <= env.keys()
    checked = check_deploy(env)
    assert checked.returncode == 0, checked.stderr
    assert "System check identified no issues" in checked.stdout


def test_without_the_https_settings_check_deploy_names_what_is_missing():
    env = {k: v for k, v in documented_environment().items() if not k.startswith(("SECURE_", "SESSION_", "CSRF_"))}
    checked = check_deploy(env)
    assert checked.returncode == 1
    for check in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert check in checked.stderr


def filler(field):
    """A value a column of this field takes (for a row that only has to go in)."""
    if field.get_internal_type() == "DateTimeField":
        return timezone.now()
    if field.get_internal_type() == "BooleanField":
        return False
    if field.get_internal_type() == "JSONField":
        return {}
    return "x" if field.get_internal_type() in ("CharField", "TextField") else 1


def test_the_previous_versions_inserts_go_in_once_the_next_versions_migrations_ran(transactional_db):
    """deploy.md "Upgrades" migrates first, while the previous version still serves: a column a
    migration adds to a table in use needs a database default, or that version's inserts, which do
    not name it, fail on its NOT NULL (setTopicConfig on a new topic answering 500 until the
    restart). Each model as it was before each such migration inserts a row into today's tables."""
    loader = MigrationLoader(connection)
    refused = []
    for key, migration in sorted(loader.disk_migrations.items()):
        added = {op.model_name for op in migration.operations if isinstance(op, AddField)}
        if key[0] != "delayqueue" or not added:
            continue
        before = loader.project_state(key, at_end=False).apps
        for name in sorted(added):
            model = before.get_model("delayqueue", name)
            values = {field.name: filler(field) for field in model._meta.concrete_fields
                      if not (field.primary_key or field.null or field.has_default()
                              or field.db_default is not NOT_PROVIDED)}
            try:
                with transaction.atomic():
                    model.objects.create(**values)
                    transaction.set_rollback(True)
            except Exception as exc:  # noqa: BLE001 - each refusal is listed
                refused.append(f"{key[1]} {name}: {str(exc).splitlines()[0]}")
    assert not refused, refused


def test_the_migrations_build_the_message_logs_indexes_without_holding_its_writes(transactional_db):
    """Each index a migration builds on the message log's tables, the largest, already in use by
    the version still serving, is built CONCURRENTLY (either way; a unique constraint takes one so
    built), so that an upgrade does not hold that version's sends for as long as the build takes
    (about a second a million rows)."""
    blocking = []
    for key in sorted(MigrationLoader(connection).disk_migrations):
        if key[0] != "delayqueue" or key[1].startswith("0001"):  # the tables themselves, empty
            continue
        for backwards in (False, True):
            out = io.StringIO()
            call_command("sqlmigrate", *key, backwards=backwards, stdout=out)
            blocking += [f"{key[1]}{' backwards' if backwards else ''}: {statement}" for statement in re.findall(
                r'CREATE (?:UNIQUE )?INDEX (?!CONCURRENTLY)[^;]* ON "delayqueue_message(?:event)?"[^;]*'
                r'|ALTER TABLE "delayqueue_message(?:event)?" ADD CONSTRAINT "\w+" UNIQUE \([^;]*', out.getvalue())]
    assert not blocking, "\n".join(blocking)
