"""Each Lua script's header (one `-- KEYS[n] name` / `-- ARGV[n] name` line each, read by its
Script) against its builder in delayqueue.live.scripts and its own body, so a header and its
caller cannot drift apart."""
import inspect
import re

import pytest

from delayqueue.live import scripts
from delayqueue.live.keys import NamespaceKeys, TopicKeys

KEY_FIELDS = {kind: set(kind.__dataclass_fields__) for kind in (TopicKeys, NamespaceKeys)}


def keys_kind(script) -> type:
    """The keys a script works on: a topic's (one Cluster slot) or, if not, its namespace's."""
    return TopicKeys if set(script.keys) <= KEY_FIELDS[TopicKeys] else NamespaceKeys

@pytest.mark.parametrize("script", scripts.SCRIPTS, ids=lambda s: s.name)
def test_header_names_topic_keys_and_the_builders_arguments(script):
    assert script.keys and set(script.keys) <= KEY_FIELDS[keys_kind(script)]
    builder = scripts.BUILDERS[script.name]
    params = [p.name for p in inspect.signature(builder).parameters.values() if p.kind is p.KEYWORD_ONLY]
    assert params == [*script.args, *([script.items] if script.repeated else [])]


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


FLAGS = {"release", "dry_run", "namespace_capped", "dead_letter"}  # yes/no ARGV, sent as 1 or 0


@pytest.mark.parametrize("script", scripts.SCRIPTS, ids=lambda s: s.name)
def test_builders_write_keys_and_args_in_header_order(script):
    """Every value stands for its slot (a key by its TopicKeys field, an ARGV by its name), so the
    call the builder writes must read back as the header."""
    k = keys_kind(script)(**{name: name for name in KEY_FIELDS[keys_kind(script)]})
    argv = {name: True if name in FLAGS else name for name in script.args}
    expected = [1 if name in FLAGS else name for name in script.args]
    if script.repeated:
        argv[script.items] = [script.repeated, script.repeated]
        expected += [*script.repeated, *script.repeated]
    call = scripts.BUILDERS[script.name](k, **argv)
    assert call.script is script
    assert call.keys == list(script.keys)
    assert call.args == expected


def test_sources_inline_every_include_once_after_the_generated_prelude():
    for script in scripts.SCRIPTS:
        assert "-- @include" not in script.source, script.name
        assert script.source.startswith(scripts.prelude())
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
