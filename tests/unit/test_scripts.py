"""The Lua scripts as loaded: includes are inlined into each script's source."""
from delayqueue.live import store


async def test_script_sources_inline_their_includes():
    for script in store.SCRIPTS.values():
        assert not store._INCLUDE.search(script.source), script.name
    assert "local function end_message" in store.SCRIPTS["pull"].source
