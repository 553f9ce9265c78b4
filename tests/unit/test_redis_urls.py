"""The Redis URL forms delayqueue/live/client.py reads: nodes, credentials and the Sentinel's
service and database, and passwords kept out of messages."""
import pytest

from delayqueue.config.redis_urls import checked_url, sentinel_target, url_credentials, url_nodes, without_password


def test_multi_node_urls_give_their_nodes_and_percent_decoded_credentials():
    url = "redis-cluster://:p%40ss%2Cword@10.0.0.1:7000,10.0.0.2:7001"
    assert url_nodes(url) == [("10.0.0.1", 7000), ("10.0.0.2", 7001)]
    assert url_credentials(url) == {"password": "p@ss,word"}
    assert url_credentials("redis-cluster://app:pw@h:1") == {"username": "app", "password": "pw"}
    assert url_credentials("redis-cluster://h:1,h:2") == {}


def test_sentinel_urls_name_the_service_the_database_and_default_to_the_sentinel_port():
    url = "redis+sentinel://:pw@s1,s2:26380/mymaster/2?sentinel_password=sp"
    assert url_nodes(url) == [("s1", 26379), ("s2", 26380)]
    assert url_credentials(url) == {"password": "pw"}
    assert sentinel_target(url) == ("mymaster", 2, {"password": "sp"})
    assert sentinel_target("redis+sentinel://s1:26379/mymaster") == ("mymaster", 0, {})
    assert checked_url(url) == url


@pytest.mark.parametrize("url, problem", [
    ("redis+sentinel://s1:26379", "must name the master's service"),
    ("redis+sentinel://s1:26379/", "must name the master's service"),
    ("redis+sentinel://s1:26379/m/1/2", "must name the master's service"),
    ("redis+sentinel://s1:26379/m/zero", "names the database 'zero'"),
    ("redis+sentinel://s1:port/m", "has a port that is not a number"),
    ("sentinel://s1:26379/m", "must be a redis://"),
])
def test_a_sentinel_url_the_client_cannot_use_is_refused_saying_why(url, problem):
    with pytest.raises(ValueError, match=problem):
        checked_url(url)


@pytest.mark.parametrize("url, shown", [
    ("redis://:secret@h:6379/0", "redis://:***@h:6379/0"),
    ("redis://user:secret@h", "redis://user:***@h"),
    ("redis://h:6379/0", "redis://h:6379/0"),
    ("redis-cluster://:secret@a:1,b:2", "redis-cluster://:***@a:1,b:2"),
    ("redis+sentinel://:secret@a:1/m/0?sentinel_password=secret&x=1", "redis+sentinel://:***@a:1/m/0?sentinel_password=***&x=1"),
    ("unix:///run/redis.sock?db=1&password=secret", "unix:///run/redis.sock?db=1&password=***"),
])
def test_without_password_hides_every_password_and_keeps_the_rest(url, shown):
    assert without_password(url) == shown
