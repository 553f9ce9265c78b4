"""Each Lua script's header (one `-- KEYS[n] name` / `-- ARGV[n] name` line each, read by its
Script) against its builder in delayqueue.live.scripts and its own body, so a header and its
caller cannot drift apart."""
import inspect
import re

import pytest

from delayqueue.core.messages import WIRE_FIELDS, Message
from delayqueue.live import scripts, stats
from delayqueue.live.history import EVENT_FIELDS
from delayqueue.live.keys import Bucket, Meta, NamespaceKeys, TopicKeys, namespace_keys

KEY_FIELDS = {kind: set(kind.__dataclass_fields__) for kind in (TopicKeys, NamespaceKeys)}


def keys_kind(script) -> type:
    """The keys a script works on: a topic's (one Cluster slot) or, if not, its namespace's."""
    return TopicKeys if set(script.keys) <= KEY_FIELDS[TopicKeys] else NamespaceKeys


def per_call_args(script) -> list[str]:
    """The ARGV a builder takes as keywords: those its context does not fill."""
    return [name for name in script.args if name not in scripts.CONTEXT_ARGS]


@pytest.mark.parametrize("script", scripts.SCRIPTS, ids=lambda s: s.name)
def test_header_names_keys_and_the_builders_arguments(script):
    assert script.keys and set(script.keys) <= KEY_FIELDS[keys_kind(script)]
    builder = scripts.BUILDERS[script.name]
    params = inspect.signature(builder).parameters.values()
    assert [p.name for p in params if p.kind is p.KEYWORD_ONLY] == [
        *per_call_args(script), *([script.items] if script.repeated else [])]
    # A topic's script is built for a topic; a namespace's takes none (take_tokens: either).
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == (["ctx", "topic"] if keys_kind(script) is TopicKeys or script is scripts.TAKE_TOKENS
                          else ["ctx"])


def test_a_header_numbered_out_of_order_is_refused():
    with pytest.raises(ValueError, match=r"KEYS\[3\] out of order"):
        scripts.header_names("-- KEYS[1] waiting\n-- KEYS[3] ready\n")
    assert scripts.header_names("-- KEYS[1] lock\n-- ARGV[1] token: who\n-- ARGV[2...] per message: a, b\n") == (
        ("lock",), ("token",), ("a", "b"), "messages")


@pytest.mark.parametrize("script", scripts.SCRIPTS, ids=lambda s: s.name)
def test_script_reads_only_the_keys_and_args_its_header_names(script):
    body = "\n".join(line for line in script.text.splitlines() if not line.startswith("--"))
    used_keys = {int(i) for i in re.findall(r"KEYS\[(\d+)\]", body)}
    used_args = {int(i) for i in re.findall(r"ARGV\[(\d+)\]", body)}
    assert used_keys == set(range(1, len(script.keys) + 1))
    assert max(used_args, default=0) <= len(script.args) or script.repeated
    assert set(range(1, len(script.args) + 1)) <= used_args


# yes/no ARGV, sent as 1 or 0
FLAGS = {"release", "release_ended", "dry_run", "namespace_capped", "dead_letter", "cold_tier", "forget_window",
         "start", "signed", "with_times", "paused", "counted_cold", "cold_counted"}
# A context whose every value stands for its own name, in a namespace whose keys end in their field names.
CONTEXT = scripts.ScriptContext(ns=namespace_keys("ns"), actor="actor", stats_interval_millis="stats_interval_millis",
                                retention_millis="retention_millis", scan_limit="scan_limit",
                                pack_lead_millis="pack_lead_millis")


@pytest.mark.parametrize("script", scripts.SCRIPTS, ids=lambda s: s.name)
def test_builders_write_keys_and_args_in_header_order(script):
    """Every value stands for its slot (an ARGV by its name, a key by its field of the topic's or
    the namespace's keys), so the call the builder writes must read back as the header."""
    from_context = {"topic": "topic", "ready_channel": CONTEXT.ready_channel,
                    "schedule_channel": CONTEXT.schedule_channel,
                    **{name: getattr(CONTEXT, name) for name in ("actor", "stats_interval_millis", "retention_millis",
                                                                 "scan_limit", "pack_lead_millis")}}
    argv = {name: True if name in FLAGS else name for name in per_call_args(script)}
    expected = [from_context[name] if name in scripts.CONTEXT_ARGS else 1 if name in FLAGS else name
                for name in script.args]
    if script.repeated:
        # An item of one value is given as that value (register_topics' topics), of more as a tuple.
        item = script.repeated if len(script.repeated) > 1 else script.repeated[0]
        argv[script.items] = [item, item]
        expected += [*script.repeated, *script.repeated]
    topic_script = keys_kind(script) is TopicKeys
    call = scripts.BUILDERS[script.name](CONTEXT, *(["topic"] if topic_script else []), **argv)
    keys = CONTEXT.ns.topic("topic") if topic_script else CONTEXT.ns
    assert call.script is script
    assert call.keys == [getattr(keys, name) for name in script.keys]
    assert call.args == expected


def test_take_tokens_takes_the_topics_bucket_or_with_no_topic_the_namespaces():
    assert scripts.take_tokens(CONTEXT, "t", kind="consume", wanted=1, rate=5).keys == [CONTEXT.ns.topic("t").buckets]
    assert scripts.take_tokens(CONTEXT, None, kind="consume", wanted=1, rate=5).keys == [CONTEXT.ns.buckets]


def test_sources_inline_every_include_once_after_the_generated_prelude():
    every_local = {name for line in scripts.prelude().splitlines() if (m := scripts._DECLARED.match(line))
                   for name in m.group(1).split(", ")}
    for script in scripts.SCRIPTS:
        assert "-- @include" not in script.source, script.name
        assert script.source == scripts.prelude(uses=script.body) + script.body
        # Of the prelude's locals, the script gets exactly those its body names.
        given = {name for line in script.source[:-len(script.body)].splitlines()
                 if (m := scripts._DECLARED.match(line)) for name in m.group(1).split(", ")}
        assert given == every_local & scripts.names_used(script.body), script.name
        functions = re.findall(r"^local function (\w+)", script.source, re.MULTILINE)
        assert len(functions) == len(set(functions)), script.name
    assert "local function end_message" in scripts.PULL.source


def test_no_status_reason_or_bound_is_spelled_in_lua():
    """Statuses, reasons and bounds come from the prelude (delayqueue.constants)."""
    for path in [*scripts.LUA_DIR.glob("*.lua"), *scripts.LUA_DIR.glob("includes/*.lua")]:
        code = "\n".join(line.split("--")[0] for line in path.read_text().splitlines())
        assert not re.search(r"status\s*(==|~=|=)\s*\d", code), path.name
        assert not re.search(r"'(acked|nacked|due|pulled|expired|deleted|restored|ack_timeout|retries_exhausted)'",
                             code), path.name


def lua_code(path) -> str:
    """A Lua file without its comments."""
    return "\n".join(line.split("--")[0] for line in path.read_text().splitlines())


LUA_FILES = [*scripts.LUA_DIR.glob("*.lua"), *scripts.LUA_DIR.glob("includes/*.lua")]


def test_no_counter_meta_field_event_field_or_bucket_is_spelled_in_lua():
    """They come from the prelude, generated from live/stats.py, live/keys.py and live/history.py."""
    spelled = {*(c.value for c in stats.Counter), *(g.value for g in stats.Gap), *(m.value for m in Meta),
               *(b.value for b in Bucket), *EVENT_FIELDS.values(), stats.LATENESS_OVERFLOW}
    for path in LUA_FILES:
        literals = set(re.findall(r"'([^']*)'", lua_code(path)))
        assert not literals & spelled, (path.name, literals & spelled)
        assert not re.search(r"'(total|lateness|m)\b[^']*:", lua_code(path)), path.name  # stats field names


def test_the_stored_message_has_the_wire_fields_in_every_script():
    """new_message.lua builds the stored message with the names of core/messages.WIRE_FIELDS (and
    Message.to_wire writes exactly those); every script reads a message's fields by those names."""
    constructor = re.search(r"local m = \{(.*?)\n  \}", (scripts.LUA_DIR / "includes/new_message.lua").read_text(), re.S)
    built = set(re.findall(r"(\w+) =", constructor.group(1))) | {"priority"}
    assert built == set(WIRE_FIELDS)
    assert set(Message("t", "i", "p", 1, 2, 3, 4, 5, 6, priority=7).to_wire()) == set(WIRE_FIELDS)
    for path in LUA_FILES:
        read = set(re.findall(r"\b(?:m|old)\.(\w+)", lua_code(path)))
        assert read <= set(WIRE_FIELDS), (path.name, read - set(WIRE_FIELDS))


def test_the_prelude_writes_each_stats_field_as_its_template():
    """Each generated Lua field function, its placeholders standing for themselves, gives back the
    template that stats.field fills in Python."""
    for name, template in stats.FIELDS.items():
        [function] = [line for line in scripts.prelude().splitlines() if f"function stats_field_{name}(" in line]
        params, body = re.match(r"local function \w+\(([\w, ]*)\) return (.*) end$", function).groups()
        pieces = [piece.strip() for piece in body.split("..")]
        rebuilt = "".join(piece[1:-1] if piece.startswith("'") else "{" + piece + "}" for piece in pieces)
        assert rebuilt == template
        assert stats.field(name, **{p: p for p in params.split(", ")}) == template.format(
            **{p: p for p in params.split(", ")})
    for group in (stats.INTERVAL_FIELDS, stats.MINUTE_FIELDS):
        patterns = {scripts.lua_prefix_pattern(stats.FIELDS[name]).split(":")[0] for name in group}
        assert len(patterns) == 1, group  # prune_stats.lua tells a group's fields by one pattern
