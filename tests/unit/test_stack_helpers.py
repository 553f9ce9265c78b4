"""tools/stack.py's pure helpers: the secrets ./dev run keeps, turning a data folder's trust
rules into password rules, how many workers (and sets of servers) ./dev test runs, and what it
says of a worker's PostgreSQL found down after a failed run."""
import json
import os
import socket
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tools.stack import (ROOT, TEST_WORKERS, asked_workers, cluster_ports, ephemeral_ports, free_cluster_port,
                         free_port, free_ports, hba_requiring_passwords, plan_workers, port_block, postgres_stop_story,
                         runs_on_callers_servers, served_url, stored_secret, trusted_rule, write_private)

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


@pytest.mark.parametrize("args,workers", [
    ([], None), (["-k", "n"], None), (["-n", "3"], 3), (["-n3"], 3), (["-n=2"], 2), (["--numprocesses", "5"], 5),
    (["--numprocesses=0"], 0), (["-n", "auto"], os.cpu_count()), (["-p", "no:xdist"], 0), (["-pno:xdist"], 0),
])
def test_the_workers_asked_for_are_read_from_pytest_arguments(args, workers):
    assert asked_workers(args) == workers


@pytest.mark.parametrize("args,sets,extra", [
    ([], TEST_WORKERS, ["-n", str(TEST_WORKERS), "--max-worker-restart", "0"]),
    (["-k", "tests", "-m", "not fault"], TEST_WORKERS, ["-n", str(TEST_WORKERS), "--max-worker-restart", "0"]),
    (["tests/integration/test_api.py"], 1, []),
    (["tests/integration/test_api.py::test_send_get_pull_ack_round_trip", "-x"], 1, []),
    (["tests/integration/test_api.py", "tests/unit/test_timer.py"], 2, ["-n", "2", "--max-worker-restart", "0"]),
    (["--deselect", "tests/integration", "tests/unit/test_timer.py"], 1, []),
    (["tests/integration"], TEST_WORKERS, ["-n", str(TEST_WORKERS), "--max-worker-restart", "0"]),
    (["-n", "0"], 1, []),
    (["-p", "no:xdist", "tests"], 1, []),
    (["-n", "3", "tests/integration/test_api.py"], 3, ["--max-worker-restart", "0"]),
])
def test_one_set_of_servers_per_worker_and_fewer_workers_for_fewer_files(args, sets, extra):
    assert plan_workers(args, own_urls=False) == (sets, extra)


def test_with_servers_of_the_callers_own_the_tests_run_without_workers():
    assert plan_workers([], own_urls=True) == (1, [])
    with pytest.raises(SystemExit, match="cannot run on several workers"):
        plan_workers(["-n", "2"], own_urls=True)


def test_the_callers_servers_are_tested_on_only_when_asked(monkeypatch, capsys):
    """The tests FLUSHALL the Redis they run on: a REDIS_URL exported for ./dev run's own server
    must not be wiped by ./dev test."""
    monkeypatch.delenv("DELAYQUEUE_TEST_OWN_SERVERS", raising=False)
    assert not runs_on_callers_servers({})
    assert not runs_on_callers_servers({"REDIS_URL": "redis://:pw@prod:6379/0", "DATABASE_URL": "postgres://db/x"})
    assert capsys.readouterr().out == ("[dev] not testing on this shell's REDIS_URL, DATABASE_URL: the tests empty "
                                       "the servers they run on (DELAYQUEUE_TEST_OWN_SERVERS=1 runs them there); "
                                       "starting servers of their own\n")
    monkeypatch.setenv("DELAYQUEUE_TEST_OWN_SERVERS", "1")
    assert runs_on_callers_servers({"REDIS_URL": "redis://:pw@ci-redis:6379/0"})
    assert not runs_on_callers_servers({})


def test_dev_help_says_what_the_commands_are_in_whole_sentences():
    shown = subprocess.run([sys.executable, "-m", "tools.stack", "--help"], cwd=ROOT, capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 0, shown.stderr
    description = " ".join(shown.stdout.split("\n\n")[1].split())
    assert description == ("The commands behind ./dev: run the service, run the test suite, or run manage.py against "
                           "the local stack, starting local Redis and PostgreSQL when REDIS_URL / DATABASE_URL are "
                           "not set.")


@pytest.mark.parametrize("host, url", [("127.0.0.1", "http://127.0.0.1:8000"), ("0.0.0.0", "http://127.0.0.1:8000"),
                                       ("::", "http://127.0.0.1:8000"), ("::1", "http://[::1]:8000"),
                                       ("queue.lan", "http://queue.lan:8000")])
def test_dev_run_shows_a_url_whose_host_the_service_answers(host, url):
    # HOST=0.0.0.0 showed http://0.0.0.0:8000, whose Host no ALLOWED_HOSTS lists: each pasted call answered 400.
    assert served_url(host, 8000) == url


def test_ports_picked_at_once_are_all_different_buses_included():
    singles = free_ports(8)
    cluster = cluster_ports(12)
    taken = singles + cluster + [port + 10_000 for port in cluster]
    assert len(set(taken)) == len(taken) == 32


def test_threads_picking_at_once_in_one_process_get_different_ports():
    """Each pick is free when made, and stays so until its server binds it: a second picker must
    not take it meanwhile."""
    with ThreadPoolExecutor(8) as pool:
        picked = list(pool.map(lambda _: free_port(), range(200)))
    assert len(set(picked)) == 200


def test_each_test_worker_picks_from_a_block_of_its_own(monkeypatch):
    """Two workers see the same ports free until one's server binds: they pick from apart."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    blocks = []
    for worker in ("gw0", "gw1", "gw2", "gw3"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        blocks.append(set(port_block(10_000, 19_999)))
        assert free_port() in blocks[-1] and free_cluster_port() in set(port_block(20_000, 22_767))
    assert all(len(block) == 2500 for block in blocks) and len(set.union(*blocks)) == 10_000
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert port_block(10_000, 19_999) == range(10_000, 20_000)  # ./dev test itself, or one worker



def test_no_worker_picks_a_port_of_the_test_servers(monkeypatch):
    """./dev test picks every worker's servers from the whole range: a port whose server a test
    has stopped looks free, and another worker's server must not take it meanwhile."""
    from tools import stack

    monkeypatch.setattr(stack, "_handed_out", set())
    monkeypatch.setattr(stack, "port_block", lambda low, high: range(15_000, 15_002))
    monkeypatch.setattr(stack, "ephemeral_ports", lambda: range(0))
    servers = {"gw1": {"DATABASE_URL": "postgres://postgres:12345@127.0.0.1:15000/delayqueue"}}
    monkeypatch.setenv("DELAYQUEUE_TEST_SERVERS", json.dumps(servers))
    assert stack.reserved_test_ports() == {15_000, 25_000}
    assert {free_port() for _ in range(5)} <= {15_001}

def test_servers_get_ports_no_outgoing_connection_could_take():
    """A client socket holding a port as its local port keeps a server from binding it: one a
    test stopped, or one started after its port was picked."""
    ports = free_ports(50)
    cluster = cluster_ports(12)
    assert not set(ports + cluster + [port + 10_000 for port in cluster]) & set(ephemeral_ports())
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as client:
            taken = client.getsockname()[1]
            assert taken in ephemeral_ports()
            with socket.socket() as restarted, pytest.raises(OSError, match="in use"):
                restarted.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                restarted.bind(("127.0.0.1", taken))


PG_LOG = [
    "2026-11-29 11:08:15.495 UTC [10492] LOG:  database system is ready to accept connections",
    "2026-11-29 11:08:16.001 UTC [10500] FATAL:  terminating connection due to administrator command",
    "2026-11-29 11:13:42.412 UTC [10492] LOG:  received fast shutdown request",
    "2026-11-29 11:13:42.800 UTC [10492] LOG:  database system is shut down",
]
TESTS = [f"2026-11-29 11:{minute:02}:00.000000 test tests/integration/test_x.py::test_{minute}" for minute in range(9, 20)]


def test_a_postgres_found_down_is_shown_with_the_tests_before_its_last_stop():
    headline, shown = postgres_stop_story(PG_LOG, TESTS)
    assert headline == "its last stop among its tests"
    assert shown[-5:] == ["2026-11-29 11:13:00.000000 test tests/integration/test_x.py::test_13", PG_LOG[2], PG_LOG[3],
                          TESTS[5], TESTS[6]]
    assert PG_LOG[1] not in shown  # per-connection noise


def test_a_postgres_gone_without_a_stop_line_is_shown_with_the_tests_after_its_last_start():
    headline, shown = postgres_stop_story(PG_LOG[:2] + [PG_LOG[0].replace("11:08:15", "11:14:00")], TESTS)
    assert headline.startswith("no stop in its log since its last start (killed?)")
    assert shown[0].endswith("ready to accept connections") and shown[1:] == TESTS[6:]
