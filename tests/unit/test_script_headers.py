"""Each Lua script's header (one `-- KEYS[n] name` / `-- ARGV[n] name` line each) against its
Python wrapper in delayqueue.live.scripts, so a header and its caller cannot drift apart."""
import inspect
import re

import pytest

from delayqueue.live import scripts
from delayqueue.live.keys import TopicKeys

HEADER = re.compile(r"^-- (KEYS|ARGV)\[(\d+)(\.\.\.)?\] ([\w, ]+?)(?::|$)", re.MULTILINE)
REPEATED = re.compile(r"^-- ARGV\[(\d+)\.\.\.\] per message: ([\w, ]+)$", re.MULTILINE)


def header(script: scripts.Script) -> tuple[list[str], list[str], list[str], str]:
    text = (scripts.LUA_DIR / f"{script.name}.lua").read_text()
    keys, args = [], []
    for kind, index, repeated, name in HEADER.findall(text):
        if repeated:
            continue
        names = keys if kind == "KEYS" else args
        assert int(index) == len(names) + 1, f"{script.name}.lua: {kind}[{index}] out of order"
        names.append(name)
    repeated = REPEATED.search(text)
    return keys, args, repeated.group(2).split(", ") if repeated else [], text


@pytest.mark.parametrize("script", scripts.SCRIPTS, ids=lambda s: s.name)
def test_header_matches_the_wrapper(script):
    keys, args, repeated, _ = header(script)
    assert tuple(keys) == script.keys
    assert tuple(args) == script.args
    assert tuple(repeated) == script.repeated
    assert set(script.keys) <= set(TopicKeys.__dataclass_fields__)
    builder = scripts.BUILDERS[script.name]
    params = [p.name for p in inspect.signature(builder).parameters.values() if p.kind is p.KEYWORD_ONLY]
    assert params == [*script.args, *(["messages"] if script.repeated else [])]


@pytest.mark.parametrize("script", scripts.SCRIPTS, ids=lambda s: s.name)
def test_script_reads_only_the_keys_and_args_its_header_names(script):
    keys, args, repeated, text = header(script)
    body = "\n".join(line for line in text.splitlines() if not line.startswith("--"))
    used_keys = {int(i) for i in re.findall(r"KEYS\[(\d+)\]", body)}
    used_args = {int(i) for i in re.findall(r"ARGV\[(\d+)\]", body)}
    assert used_keys == set(range(1, len(keys) + 1))
    assert max(used_args, default=0) <= len(args) or repeated
    assert set(range(1, len(args) + 1)) <= used_args


FLAGS = {"release", "dry_run"}  # yes/no ARGV, sent as 1 or 0


@pytest.mark.parametrize("script", scripts.SCRIPTS, ids=lambda s: s.name)
def test_builders_write_keys_and_args_in_header_order(script):
    """Every value stands for its slot (a key by its TopicKeys field, an ARGV by its name), so the
    call the builder writes must read back as the header."""
    k = TopicKeys(**{name: name for name in TopicKeys.__dataclass_fields__})
    argv = {name: True if name in FLAGS else name for name in script.args}
    expected = [1 if name in FLAGS else name for name in script.args]
    if script.repeated:
        argv["messages"] = [script.repeated, script.repeated]
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
