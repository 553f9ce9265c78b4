"""The `delayqueue` command line (sdk/python/delayqueue_client/cli.py) run as real subprocesses
against a real uvicorn: every command, its output, its one-line errors and its exit codes
(0 done, 1 refused or not found, 2 usage, 3 unreachable or failing, 4 answer lost); and the SDK
installed into a fresh venv without Django, its console script included."""
import http.server
import io
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from delayqueue_client import Client, cli

from tests.integration.test_tokens import new_token
from tools.stack import free_port

pytestmark = pytest.mark.process

SDK_DIR = Path(__file__).resolve().parents[2] / "sdk" / "python"
CLI = [sys.executable, "-m", "delayqueue_client.cli"]


def cli_env(url: str | None, token: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DELAYQUEUE_URL", "DELAYQUEUE_TOKEN")}
    if url:
        env["DELAYQUEUE_URL"] = url
    if token:
        env["DELAYQUEUE_TOKEN"] = token
    return env


def run_cli(url: str | None, *args: str, token: str | None = None, stdin: str | None = None,
            timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), env=cli_env(url, token), input=stdin, capture_output=True, text=True,
                          timeout=timeout)


def ok(result: subprocess.CompletedProcess) -> str:
    assert (result.returncode, result.stderr) == (0, ""), result
    return result.stdout


def failed(result: subprocess.CompletedProcess, code: int) -> str:
    """The one error line of a failed command (for usage errors: the last line, after argparse's usage)."""
    assert result.returncode == code, result
    assert result.stdout == "" and "Traceback" not in result.stderr, result
    return result.stderr.splitlines()[-1] if code == 2 else result.stderr.removesuffix("\n")


@pytest.fixture
def client(sdk_server):
    with Client(sdk_server) as c:
        yield c


def test_send_with_every_option_then_get_and_delete(sdk_server, client):
    before = int(time.time() * 1000)
    sent = json.loads(ok(run_cli(sdk_server, "send", "orders", "cancel 42", "--delay", "5m", "--msg-id", "o42",
                                 "--ttl", "1h", "--max-retry", "2", "--priority", "3", "--json")))
    assert (sent["topic"], sent["msg_id"], sent["msg"], sent["max_retry"], sent["priority"], sent["status"]) == (
        "orders", "o42", "cancel 42", 2, 3, 1)
    assert before + 300_000 <= sent["trigger_time"] <= int(time.time() * 1000) + 300_000
    assert sent["expire_time"] == sent["trigger_time"] + 3_600_000
    assert client.get("orders", "o42").msg == "cancel 42"

    human = ok(run_cli(sdk_server, "send", "orders", "now", "--msg-id", "n1"))
    assert human.startswith("sent n1 to orders, due ") and human.endswith(" (ready)\n")
    at = "2031-05-06T07:08:09.250+00:00"
    ok(run_cli(sdk_server, "send", "orders", "-", "--at", at, "--msg-id", "at1", stdin="from stdin\n"))
    stored = client.get("orders", "at1")
    assert (stored.msg, stored.trigger_time) == ("from stdin\n", int(datetime.fromisoformat(at).timestamp() * 1000))
    ok(run_cli(sdk_server, "send", "orders", "epoch", "--at", "1999999999000", "--msg-id", "at2"))
    assert client.get("orders", "at2").trigger_time == 1999999999000
    generated = json.loads(ok(run_cli(sdk_server, "send", "orders", "no id", "--delay", "250ms", "--json")))
    assert len(generated["msg_id"]) == 32

    got = json.loads(ok(run_cli(sdk_server, "get", "orders", "o42", "--json")))
    assert got == sent
    lines = ok(run_cli(sdk_server, "get", "orders", "o42")).splitlines()
    assert "msg_id       o42" in lines and "status       1 waiting" in lines and lines[-1] == "msg          cancel 42"
    assert failed(run_cli(sdk_server, "get", "orders", "missing"), 1) == (
        "delayqueue: error: 404 message missing not found in topic orders")

    assert ok(run_cli(sdk_server, "delete", "orders", "o42")) == "deleted o42 from orders\n"
    assert client.get("orders", "o42").status == 7
    assert failed(run_cli(sdk_server, "delete", "orders", "o42"), 1) == (
        "delayqueue: error: 404 message o42 not found or already ended in topic orders")


def test_a_refused_request_is_one_line_with_its_code_and_exit_1(sdk_server):
    line = failed(run_cli(sdk_server, "send", "t", "x", "--priority", "12"), 1)
    assert line.startswith("delayqueue: error: 400 ") and "priority" in line and "\n" not in line


@pytest.mark.parametrize("args, problem", [
    ((), "the following arguments are required: COMMAND"),
    (("send", "t", "x", "--delay", "3"), "invalid duration '3': a number and a unit, e.g. 250ms, 3s, 5m, 2h, 1d"),
    (("send", "t", "x", "--delay", "3s", "--at", "1999999999000"), "not allowed with argument --delay"),
    (("send", "t", "x", "--at", "next tuesday"), "invalid time 'next tuesday'"),
    (("consume", "t", "--batch", "0"), "invalid count '0'"),
    (("consume", "t", "--batch", "²"), "invalid count '²'"),  # a digit to str.isdigit, not to int()
    (("dead", "purge", "t"), "name them with --msg-id, or pass --all"),
    (("frobnicate",), "invalid choice: 'frobnicate'"),
    (("--url", "queue.example:8000", "stats"), "the server URL must be http(s)://host[:port][/prefix]"),
])
def test_usage_errors_exit_2_naming_the_problem(sdk_server, args, problem):
    line = failed(run_cli(sdk_server, *args), 2)
    assert line.startswith("delayqueue") and ": error: " in line and problem in line


def test_a_url_not_leading_to_the_api_is_a_usage_error_saying_so_not_the_servers_500(sdk_server):
    """A wrong prefix answers the site's 404 page: neither worth another try later (3) nor a lost answer (4)."""
    for args in (("get", "t", "x"), ("delete", "t", "x")):
        line = failed(run_cli(f"{sdk_server}/wrong", *args), 2)
        assert line == f"delayqueue: error: HTTP 404 answer, not the delay queue API's: check the base URL " \
                       f"({sdk_server}/wrong)"


def test_an_unreachable_server_exits_3():
    url = f"http://127.0.0.1:{free_port()}"
    line = failed(run_cli(url, "get", "t", "x"), 3)
    assert line.startswith("delayqueue: error: delayqueue server unreachable: ConnectionRefusedError") and line.endswith(
        f"({url})")
    assert failed(run_cli(None, "--url", url, "stats"), 3).endswith(f"({url})")  # --url beats the environment


def test_a_token_in_the_url_path_is_in_no_error():
    url = f"http://127.0.0.1:{free_port()}"
    result = run_cli(f"{url}/t/dq_in_path", "get", "t", "x")  # as camellia's SDK takes its token
    assert failed(result, 3).endswith(f"({url}/t/***)") and "dq_in_path" not in result.stderr


def test_a_lost_answer_exits_4_for_a_command_that_may_have_been_applied_and_3_for_a_read():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)

        def drop_answers():  # reads each request whole and closes: the answer is lost
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                with conn:  # closed with a byte unread, the close would be a reset, not a lost answer
                    request = b""
                    while b"\r\n\r\n" not in request and (chunk := conn.recv(65536)):
                        request += chunk
                    head, _, body = request.partition(b"\r\n\r\n")
                    length = re.search(rb"(?i)content-length: *(\d+)", head)
                    while length and len(body) < int(length.group(1)) and (chunk := conn.recv(65536)):
                        body += chunk
        threading.Thread(target=drop_answers, daemon=True).start()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        line = failed(run_cli(url, "delete", "t", "m1"), 4)
        assert line.startswith("delayqueue: error: deleteMsg: the answer was lost, the call may have been applied: "
                               "RemoteDisconnected") and line.endswith(f"({url})")
        assert "unreachable: RemoteDisconnected" in failed(run_cli(url, "get", "t", "m1"), 3)  # a read: retried


def test_a_server_error_that_persists_after_the_retries_exits_3_not_1():
    """Code 1 says the request was refused (do not try it again as is); a store unavailable is the
    server's trouble, worth another try later, as an unreachable one."""
    requests = []

    class Failing(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):  # as the server answers while Redis is down
            self.rfile.read(int(self.headers["Content-Length"]))
            requests.append(self.path)
            content = json.dumps({"code": 500, "msg": "redis unavailable: ConnectionError"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        line = failed(run_cli(url, "get", "t", "m1"), 3)
        assert line == f"delayqueue: error: 500 redis unavailable: ConnectionError ({url})"
        assert len(requests) == 5  # the first try and the client's 4 retries
        assert failed(run_cli(url, "delete", "t", "m1"), 3).endswith(f"({url})")  # answered: not lost (4)
    finally:
        server.shutdown()
        server.server_close()


def test_tokens_from_the_environment_or_option_never_in_an_error(web_processes):
    (web,) = web_processes(1, DELAYQUEUE_AUTH="tokens")
    token = new_token(namespace="shop", scopes=["produce", "consume", "monitor"])
    assert failed(run_cli(web.url, "stats"), 1).startswith("delayqueue: error: 401 ")
    ok(run_cli(web.url, "send", "t", "x", "--msg-id", "e1", token=token))
    assert json.loads(ok(run_cli(web.url, "get", "t", "e1", "--json", "--token", token)))["msg_id"] == "e1"
    wrong = "dq_" + "x" * 43
    result = run_cli(web.url, "get", "t", "e1", token=wrong)
    assert failed(result, 1).startswith("delayqueue: error: 401 ") and wrong not in result.stderr
    ok(run_cli(web.url, "get", "t", "e1", token=token + "\n"))  # as a secret file holds it
    result = run_cli(web.url, "get", "t", "e1", token=token[:9] + "\r\n" + token[9:])
    assert "the token must be printable ASCII" in failed(result, 2) and token[9:] not in result.stderr


def test_consume_prints_and_acks_or_leaves_them_with_no_ack(sdk_server, client):
    for i in range(3):
        client.send("jobs", f"job {i}", msg_id=f"j{i}")
    printed = [json.loads(line) for line in
               ok(run_cli(sdk_server, "consume", "jobs", "--json", "--count", "2", "--batch", "5")).splitlines()]
    assert [(m["msg_id"], m["msg"], m["status"]) for m in printed] == [("j0", "job 0", 3), ("j1", "job 1", 3)]
    assert [client.get("jobs", f"j{i}").status for i in range(3)] == [4, 4, 2]  # acked; j2 not taken

    assert ok(run_cli(sdk_server, "consume", "jobs", "--no-ack", "--count", "1")) == "j2\tjob 2\n"
    assert client.get("jobs", "j2").status == 3  # left consuming, for its ack timeout


def test_consume_prints_messages_as_they_come_and_ctrl_c_stops_cleanly(sdk_server, client):
    proc = subprocess.Popen(CLI + ["consume", "live"], env=cli_env(sdk_server), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        client.send("live", "first", msg_id="l1")
        assert lines.get(timeout=15) == "l1\tfirst\n"  # while the process keeps running
        client.send("live", "second", msg_id="l2")  # the consumer is long-polling by now
        assert lines.get(timeout=15) == "l2\tsecond\n"
        deadline = time.monotonic() + 5
        while client.get("live", "l2").status != 4:  # acked just after printing
            assert time.monotonic() < deadline, "l2 not acked"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # mid long poll
        assert proc.wait(timeout=10) == 0
        assert proc.stderr.read() == "" and lines.empty()
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    assert client.get("live", "l1").status == 4


def test_ctrl_c_while_consume_prints_a_message_finishes_the_line_and_acks_it(sdk_server, client, monkeypatch):
    # A message half printed when Ctrl-C came was left unacked, so it came back and was printed twice.
    client.send("printing", "the message", msg_id="p1")
    written = []

    class Terminal(io.StringIO):
        def write(self, text: str) -> int:
            written.append(text)
            if len(written) == 1:  # Ctrl-C lands inside print(), the line begun
                os.kill(os.getpid(), signal.SIGINT)
            return len(text)

    monkeypatch.setattr(sys, "stdout", Terminal())
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    assert cli.main(["--url", sdk_server, "consume", "printing"]) == 0
    assert "".join(written) == "p1\tthe message\n"
    assert client.get("printing", "p1").status == 4
    assert {signum: signal.getsignal(signum) for signum in handlers} == handlers  # given back to the caller


def test_consume_acks_only_the_delivery_it_printed_not_one_made_since(sdk_server, client):
    # Its print blocks on a pipe nobody reads (the message is bigger than the pipe's buffer) while
    # the message is given back and pulled by another consumer: the late ack must not end that one.
    client.send("slow-reader", "x" * 200_000, msg_id="s1")
    proc = subprocess.Popen(CLI + ["consume", "slow-reader", "--count", "1"], env=cli_env(sdk_server),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 15
        while client.get("slow-reader", "s1").status != 3:  # pulled, and printing
            assert time.monotonic() < deadline, "the consumer did not pull"
            time.sleep(0.05)
        assert client.nack("slow-reader", "s1") is True
        [again] = client.pull("slow-reader", wait_ms=5_000)
        assert again.retry == 2
        assert proc.stdout.read() == f"s1\t{'x' * 200_000}\n"
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert client.get("slow-reader", "s1").status == 3  # still this consumer's
    assert client.ack("slow-reader", "s1", retry=again.retry) is True


def test_stats_of_every_topic_and_of_one(sdk_server, client):
    assert ok(run_cli(sdk_server, "stats")) == "no topics\n"
    client.send("alpha", "a", msg_id="a1")
    client.send("alpha", "a", msg_id="a2", delay_ms=60_000)
    client.send("beta", "b", msg_id="b1")
    client.pull("beta")
    table = ok(run_cli(sdk_server, "stats")).splitlines()
    assert table[0].split() == ["topic", "waiting", "ready", "consuming"]
    assert [row.split() for row in table[1:]] == [["alpha", "1", "1", "0"], ["beta", "0", "0", "1"]]
    infos = json.loads(ok(run_cli(sdk_server, "stats", "--json")))
    assert [(i["topic"], i["waitingQueueSize"], i["readyQueueSize"], i["ackQueueSize"]) for i in infos] == [
        ("alpha", 1, 1, 0), ("beta", 0, 0, 1)]
    one = json.loads(ok(run_cli(sdk_server, "stats", "alpha", "--json")))
    assert one == infos[0]
    human = ok(run_cli(sdk_server, "stats", "alpha"))
    assert human.splitlines()[1].split() == ["alpha", "1", "1", "0"] and "waiting, by time until due:" in human
    buckets = [line.split() for line in human.split("waiting, by time until due:\n")[1].splitlines()]
    assert ["sizeOf30dayToInfinite", "0"] in buckets and all(len(b) == 2 for b in buckets)  # label, count


def test_dead_list_redrive_and_purge(sdk_server, client, scanner_process):
    scanner_process("cli").wait_started()  # its log writer records the deaths the listing reads

    def kill(msg_id, reason=None):
        client.send("dl", f"body {msg_id}", msg_id=msg_id)
        client.pull("dl")
        assert client.nack("dl", msg_id, dead_letter=True, reason=reason)
    kill("x1")
    kill("x2", reason="card declined")
    deadline = time.monotonic() + 10
    while len(client.dead_letters("dl").messages) < 2:
        assert time.monotonic() < deadline, "dead letters not listed"
        time.sleep(0.05)

    # Options go before or after the command, between `dead` and `list` too.
    listed = json.loads(ok(run_cli(sdk_server, "dead", "--json", "list", "dl", "--limit", "1")))
    assert json.loads(ok(run_cli(sdk_server, "dead", "list", "dl", "--json", "--limit", "1"))) == listed
    assert [(m["msg_id"], m["dead_reason"]) for m in listed["messages"]] == [("x1", "dead_lettered")]
    rest = ok(run_cli(sdk_server, "dead", "list", "dl", "--cursor", listed["next_cursor"]))
    assert rest.startswith("x2\t") and rest.rstrip().endswith("dead_lettered: card declined\tbody x2")
    assert ok(run_cli(sdk_server, "dead", "list", "empty")) == "no dead letters in empty\n"

    done = json.loads(ok(run_cli(sdk_server, "dead", "redrive", "dl", "--msg-id", "x1", "--rate", "50", "--wait",
                                 "--json")))
    assert (done["moved"], done["left"], done["state"]) == (1, 0, "done") and isinstance(done["task_id"], int)
    assert client.get("dl", "x1").status == 2  # live again
    assert failed(run_cli(sdk_server, "dead", "redrive", "dl", "--msg-id", "nope"), 1).startswith(
        "delayqueue: error: 404 ")

    assert ok(run_cli(sdk_server, "dead", "purge", "dl", "--all")) == "purged 1 dead letters from dl\n"
    assert client.dead_letters("dl").messages == []


def test_the_sdk_installs_into_a_fresh_venv_without_django(tmp_path):
    venv = tmp_path / "venv"
    # Without a pip of its own (ensurepip spends seconds installing one): this environment's pip
    # installs the SDK into it (pip --python), so it holds the SDK and what the SDK brings alone.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python, script = venv / "bin" / "python", venv / "bin" / "delayqueue"
    # A copy, so the build leaves nothing (build/, *.egg-info) in the worktree.
    source = shutil.copytree(SDK_DIR, tmp_path / "sdk", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--disable-pip-version-check",
                    str(source)], check=True, timeout=300, capture_output=True)
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # (That importing the SDK leaves Django alone where it is installed: test_sdk_django.)
    probe = ("import importlib.util, delayqueue_client as dq\n"
             "assert dq.Client and dq.NotFound and dq.Message\n"
             "print(dq.__file__, importlib.util.find_spec('django'))")
    shown = subprocess.run([str(python), "-c", probe], env=clean, cwd=tmp_path, capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 0, shown.stderr
    where, django_spec = shown.stdout.split()
    assert where.startswith(str(venv)) and django_spec == "None"  # the installed copy, and no Django at all
    assert (Path(where).parent / "py.typed").is_file()  # type checkers read the installed package's annotations
    helped = subprocess.run([str(script), "--help"], env=clean, capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "exit codes: 0 done" in helped.stdout
    without = subprocess.run([str(python), "-c", "import delayqueue_client.django"], env=clean, cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)
    assert without.returncode == 1 and "No module named 'django'" in without.stderr
