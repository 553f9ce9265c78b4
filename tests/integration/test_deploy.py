"""docs/deploy.md's settings are complete: with exactly the two environment files it shows (each
`<...>` filled in), `manage.py check --deploy` reports nothing; without them it does (so the
check is not vacuous)."""
import os
import re
import secrets
import subprocess
import sys

import pytest

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
