"""delayqueue_client.django.send_on_commit with the project's own Django and its PostgreSQL test
database, against a real uvicorn: a transaction that commits sends, one that rolls back sends nothing."""
import subprocess
import sys

import pytest
from delayqueue_client import Client, Message
from delayqueue_client.django import default_client, send_on_commit
from django.db import transaction

from delayqueue.models import ApiToken
from tests.integration.test_sdk_docs import example

pytestmark = pytest.mark.process


@pytest.fixture
def client(web_processes):
    with Client(web_processes(1)[0].url) as c:
        yield c


def a_write(name: str) -> None:
    """Any row, so the transaction has something of the caller's to commit or roll back."""
    ApiToken.objects.create(name=name, namespace="default", scopes="produce", token_hash=name.ljust(64, "0"))


def test_a_committed_transaction_sends_after_its_commit(client):
    with transaction.atomic():
        a_write("committed")
        msg_id = send_on_commit("orders", "order 42 paid", client=client, delay_ms=60_000, priority=2)
        assert client.get("orders", msg_id) is None  # not before the commit
    sent = client.get("orders", msg_id)
    assert isinstance(sent, Message) and (sent.msg, sent.priority, sent.status) == ("order 42 paid", 2, 1)
    assert ApiToken.objects.filter(name="committed").exists()

    given = send_on_commit("orders", "no transaction: at once", client=client, msg_id="mine")
    assert given == "mine" and client.get("orders", "mine").status == 2


def test_a_rolled_back_transaction_sends_nothing(client):
    with pytest.raises(RuntimeError), transaction.atomic():
        a_write("rolled-back")
        send_on_commit("orders", "never", client=client, msg_id="never")
        raise RuntimeError("the caller's work failed")
    with transaction.atomic():  # a savepoint rolled back inside a committed transaction: its send is dropped too
        try:
            with transaction.atomic():
                send_on_commit("orders", "inner", client=client, msg_id="inner")
                raise RuntimeError
        except RuntimeError:
            pass
        send_on_commit("orders", "outer", client=client, msg_id="outer")
    assert client.get("orders", "never") is None and client.get("orders", "inner") is None
    assert client.get("orders", "outer") is not None
    assert client.topic_info("orders")["readyQueueSize"] == 1
    assert not ApiToken.objects.filter(name="rolled-back").exists()


def test_bad_arguments_fail_in_the_caller_and_the_default_client_reads_the_environment(client, monkeypatch):
    with transaction.atomic():
        with pytest.raises(TypeError, match="msg must be a str"):
            send_on_commit("orders", {"not": "text"}, client=client)
        with pytest.raises(TypeError):
            send_on_commit("orders", "x", client=client, colour="red")
    monkeypatch.setenv("DELAYQUEUE_URL", client.base_url)
    monkeypatch.setattr("delayqueue_client.django._default_client", None)
    with transaction.atomic():
        send_on_commit("orders", "by default", msg_id="d1")
    assert default_client().base_url == client.base_url and client.get("orders", "d1").msg == "by default"
    default_client().close()


def test_the_docs_example_sends_at_the_commit(client, monkeypatch):
    monkeypatch.setenv("DELAYQUEUE_URL", client.base_url)
    monkeypatch.setattr("delayqueue_client.django._default_client", None)
    names: dict = {}
    exec(example("send_on_commit(\"emails\""), names)
    sent = client.get("emails", names["welcome_id"])
    assert (sent.msg, sent.status) == (f"welcome {names['user'].pk}", 1)  # waiting its minute
    default_client().close()


def test_importing_the_client_does_not_import_django():
    probe = "import sys, delayqueue_client; assert 'django' not in sys.modules, 'django imported'"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).returncode == 0
