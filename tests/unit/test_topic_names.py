"""Topic names as camellia accepts them (delayqueue/core/names.py) and their encoding inside Redis key
names (delayqueue/live/keys.py): reversible, the old names' keys unchanged, and no character of
a topic able to move the hash tag or act as a glob metacharacter."""
import fnmatch
import random
import string

import pytest
from redis.crc import key_slot

from delayqueue.core.constants import MAX_TOPIC_BYTES
from delayqueue.core.names import TOPIC_RULE, topic_problem
from delayqueue.live.keys import (HISTORY_SUFFIX, READY_SUFFIX, Shard, TopicKeys, key_text, namespace_keys, topic_keys,
                                  topic_of_key_text)

# The names the tests put through every layer: each character the key encoding must handle.
ODD_TOPICS = ["my topic", "a/b", "{}", "{a}b}", "*", "?", "[x]", "%41", "\\", "订单-cancel", " padded ",
              "a}:history", "%", "%%7B", "é" * 127 + "x"]
KEY_NAMES = [name for name in TopicKeys.__dataclass_fields__ if name != "topic"]


def test_old_names_keep_their_keys():
    """Topics valid under the old rule ([A-Za-z0-9._:-]{1,128}) map to the keys they always had:
    no migration of live data."""
    alphabet = string.ascii_letters + string.digits + "._:-"
    rng = random.Random(16)
    for topic in [alphabet, "orders", "a:b.c_d-e", *("".join(rng.choices(alphabet, k=rng.randint(1, 128)))
                                                     for _ in range(200))]:
        assert key_text(topic) == topic
        assert topic_keys("default", topic).waiting == f"dq:{{default:{topic}}}:waiting"


@pytest.mark.parametrize("topic", ODD_TOPICS)
def test_key_text_round_trips_and_leaves_nothing_that_breaks_a_key(topic):
    text = key_text(topic)
    assert topic_of_key_text(text) == topic
    assert not set(text) & set("{}*?[]\\")
    keys = topic_keys("default", topic)
    assert keys.topic == topic
    # One hash tag, the whole "namespace:topic": every key of the topic is in one slot.
    assert {key_slot(getattr(keys, name).encode()) for name in KEY_NAMES} == {key_slot(f"default:{text}".encode())}


def test_the_encoding_spelled_out():
    assert [key_text(t) for t in ["{a}b}", "%41", "*?[x]\\", "a/b c", "订单-cancel"]] == [
        "%7Ba%7Db%7D", "%2541", "%2A%3F%5Bx%5D%5C", "a/b c", "订单-cancel"]
    assert topic_keys("default", "{a}b}").msgs == "dq:{default:%7Ba%7Db%7D}:msgs"


def test_topics_after_a_brace_still_spread_over_the_cluster():
    """Raw, "}1", "}2", ... would all hash "default:" alone: one slot for all of them."""
    assert len({key_slot(topic_keys("default", f"}}{i}").msgs.encode()) for i in range(100)}) > 90


def test_distinct_topics_get_distinct_keys():
    """Injective: a topic spelling another's encoding is encoded again, so they never share keys."""
    topics = ["{", "%7B", "%257B", "%", "%25", "a*", "a%2A", "*", "\\", "%5C"]
    assert len({key_text(t) for t in topics}) == len(topics)


@pytest.mark.parametrize("topic", [*ODD_TOPICS, "a%s3.1.5", "%s2.0.0"])
@pytest.mark.parametrize("shard", [(1, 0), (3, 2), (256, 255)])
def test_the_history_channel_and_the_ready_list_lead_back_to_their_topic_and_shard(topic, shard):
    """The names the history pattern and the ready channel carry."""
    ns, other = namespace_keys("default"), namespace_keys("other")
    keys = ns.topic(Shard(topic, *shard))
    assert keys.history.endswith(f":{HISTORY_SUFFIX}") and keys.ready.endswith(f":{READY_SUFFIX}")
    assert ns.shard_of_history(keys.history) == ns.shard_of_ready(keys.ready) == Shard(topic, *shard)
    assert ns.shard_of_ready(keys.history) is None and ns.shard_of_history(keys.ready) is None
    # Redis' glob, as fnmatch spells it for a pattern without brackets: every topic's channel matches.
    assert fnmatch.fnmatchcase(keys.history, ns.history_pattern.replace("\\", ""))
    assert other.shard_of_history(keys.history) is None and other.shard_of_ready(keys.ready) is None


def test_the_topic_rule():
    for good in ["x", " ", "订单-cancel", "x" * MAX_TOPIC_BYTES, "é" * 127 + "x", "订" * 85, "\U0001F600" * 63,
                 "\xa0", "a\u2028b", *ODD_TOPICS]:
        assert topic_problem(good) is None, good
    refused = {
        "": "it is empty",
        "x" * (MAX_TOPIC_BYTES + 1): "it is 256 bytes",
        "é" * 128: "it is 256 bytes",
        "订" * 86: "it is 258 bytes",
        "\U0001F600" * 64: "it is 256 bytes",
        "a\nb": "it has U+000A",
        "\x00": "it has U+0000",
        "tab\t": "it has U+0009",
        "a\x1f": "it has U+001F",
        "del\x7f": "it has U+007F",
        "c1\x80": "it has U+0080",
        "nel\x85": "it has U+0085",
        "c1\x9f": "it has U+009F",
        "lone\ud800": "it has U+D800",
    }
    for bad, why in refused.items():
        assert topic_problem(bad) == f"{TOPIC_RULE}; {why}", bad
