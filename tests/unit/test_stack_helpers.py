"""tools/stack.py's pure helpers: the secrets ./dev run keeps, and turning a data folder's
trust rules into password rules."""
import stat

from tools.stack import hba_requiring_passwords, stored_secret, trusted_rule, write_private

OLD_HBA = """# TYPE  DATABASE        USER            ADDRESS                 METHOD
# "local" is for Unix domain socket connections only; trust would be
local   all             all                                     trust
host    all             all             127.0.0.1/32            trust
host    all             all             ::1/128                 trust
local   replication     all                                     trust
"""


def test_a_stored_secret_is_made_once_readable_by_its_owner_only_and_then_reused(tmp_path):
    path = tmp_path / "run" / "redis.password"
    first = stored_secret(path)
    assert len(first) >= 32 and path.read_text() == first + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stored_secret(path) == first
    assert stored_secret(tmp_path / "other") != first


def test_write_private_replaces_a_file_and_keeps_it_0600_whatever_it_was(tmp_path):
    path = tmp_path / "redis.conf"
    path.write_text("old")
    path.chmod(0o644)
    write_private(path, "requirepass x\n")
    assert path.read_text() == "requirepass x\n" and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_every_trust_rule_asks_for_a_scram_password_and_comments_are_left_alone():
    changed = hba_requiring_passwords(OLD_HBA)
    rules = [line for line in changed.splitlines() if line and not line.startswith("#")]
    assert len(rules) == 4 and all(line.split()[-1] == "scram-sha-256" for line in rules)
    assert rules[1].split() == ["host", "all", "all", "127.0.0.1/32", "scram-sha-256"]
    assert '# "local" is for Unix domain socket connections only; trust would be' in changed
    assert not any(trusted_rule(line) for line in changed.splitlines())
    assert hba_requiring_passwords(changed) == changed
