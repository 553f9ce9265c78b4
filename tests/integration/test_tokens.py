"""API tokens: created, listed and revoked by the commands and the admin; stored only hashed;
checked on every queue endpoint by scope and namespace."""
import hashlib
import io
import re

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from delayqueue.models import ApiToken

TOKEN_RE = re.compile(r"dq_[A-Za-z0-9_-]{43}")


def run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_create_token_prints_the_token_alone_on_its_last_line_and_stores_only_its_hash():
    out = run("create_token", "--namespace", "shop", "--scopes", "consume,produce", "--name", "orders-app")
    token = out.splitlines()[-1]
    assert TOKEN_RE.fullmatch(token)
    row = ApiToken.objects.get(name="orders-app")
    assert (row.namespace, row.scopes) == ("shop", "produce,consume")
    assert row.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert token not in str(ApiToken.objects.values().get())  # the token itself is nowhere in the row


@pytest.mark.django_db
def test_create_token_generates_a_name_and_refuses_bad_input_in_one_line():
    first = run("create_token", "--namespace", "shop", "--scopes", "monitor").splitlines()[-1]
    assert ApiToken.objects.get().name.startswith("shop-")
    assert TOKEN_RE.fullmatch(first)
    run("create_token", "--namespace", "shop", "--scopes", "monitor", "--name", "dup")
    for args, problem in [(("--scopes", "produce,admin"), "unknown scope 'admin'"),
                          (("--scopes", "produce", "--name", "dup"), "a token named 'dup' already exists"),
                          (("--scopes", ","), "at least one scope"),
                          (("--scopes", "produce", "--namespace", "a:b"), "not a namespace")]:
        options = {"--namespace": "shop", **dict(zip(args[::2], args[1::2]))}
        with pytest.raises(CommandError, match=re.escape(problem)) as caught:
            run("create_token", *[x for kv in options.items() for x in kv])
        assert "\n" not in str(caught.value)
    assert ApiToken.objects.count() == 2


@pytest.mark.django_db
def test_list_tokens_shows_each_token_but_never_the_token_and_revoke_marks_it():
    token = run("create_token", "--namespace", "shop", "--scopes", "produce", "--name", "a").splitlines()[-1]
    run("create_token", "--namespace", "other", "--scopes", "manage,monitor", "--name", "b")
    assert run("revoke_token", "a") == "revoked token a (namespace shop)\n"
    listing = run("list_tokens").splitlines()
    assert listing[0].split() == ["NAME", "NAMESPACE", "SCOPES", "CREATED", "REVOKED"]
    a, b = (line.split() for line in listing[1:])
    assert a[:3] == ["a", "shop", "produce"] and a[-1] != "-"
    assert b[:3] == ["b", "other", "manage,monitor"] and b[-1] == "-"
    assert token not in "\n".join(listing)
    assert ApiToken.objects.get(name="a").token_hash not in "\n".join(listing)
    with pytest.raises(CommandError, match="no token named 'nope'"):
        run("revoke_token", "nope")


@pytest.mark.django_db
def test_the_admin_creates_a_token_shown_once_and_revokes_it(client):
    User.objects.create_superuser("boss", password="pw")
    client.force_login(User.objects.get())
    response = client.post("/admin/delayqueue/apitoken/add/",
                           {"name": "web", "namespace": "shop", "scopes": ["produce", "monitor"]}, follow=True)
    shown = TOKEN_RE.findall(response.content.decode())
    assert len(shown) == 1
    row = ApiToken.objects.get(name="web")
    assert (row.scopes, row.token_hash) == ("produce,monitor", hashlib.sha256(shown[0].encode()).hexdigest())
    listing = client.get("/admin/delayqueue/apitoken/").content.decode()
    assert "web" in listing and shown[0] not in listing
    detail = client.get(f"/admin/delayqueue/apitoken/{row.pk}/change/").content.decode()
    assert shown[0] not in detail
    refused = client.post("/admin/delayqueue/apitoken/add/", {"name": "x", "namespace": "a{b}", "scopes": ["produce"]})
    assert "not a namespace" in refused.content.decode()
    client.post("/admin/delayqueue/apitoken/", {"action": "revoke_selected", "_selected_action": [row.pk]})
    assert ApiToken.objects.get(name="web").revoked_at is not None
