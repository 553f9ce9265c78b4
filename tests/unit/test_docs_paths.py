"""The docs name only files that exist: every `path.py` or `name.lua` they mention (in backticks)
is a file of the repository, by its path from the root, from delayqueue/ or from the Lua folder,
or (a bare name) somewhere in the tree; and docs/architecture.md's layer table lists
delayqueue.LAYERS in order."""
import re

from delayqueue import LAYERS
from delayqueue.live.keys import Meta, NamespaceKeys, TopicKeys, namespace_keys
from tests.helpers import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "spark" / "README.md",
        ROOT / "templates" / "README.md", ROOT / "sdk" / "python" / "README.md"]
BASES = [ROOT, ROOT / "delayqueue", ROOT / "delayqueue" / "live" / "lua", ROOT / "sdk" / "python"]
MENTION = re.compile(r"`[^`\s]*?([\w./-]+\.(?:py|lua))\b")


def exists(name: str) -> bool:
    if "/" in name:
        return any((base / name).is_file() for base in BASES)
    return any(path.name == name for path in ROOT.rglob(name) if ".venv" not in path.parts)


def test_every_file_the_docs_name_exists():
    missing = sorted({f"{doc.relative_to(ROOT)}: {name}" for doc in DOCS for name in MENTION.findall(doc.read_text())
                      if not exists(name)})
    assert not missing, "\n".join(missing)


def test_the_architecture_lists_the_layers_in_order():
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## Layers"):]
    rows = re.findall(r"^\| (\w+) \| `", section, re.M)
    assert rows[:len(LAYERS)] == [name for name, _ in LAYERS]


def test_the_architecture_lists_every_redis_key():
    """Its table of a topic's keys has a row per key of live/keys.TopicKeys, whose `meta` row names
    every Meta field, and its paragraph of a namespace's keys names every key of NamespaceKeys
    (pub/sub patterns aside)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("| key `dq:{ns:topic}:…` | type | holds |\n", 1)[1].split("\n\n", 1)[0]
    assert sorted(re.findall(r"^\| `(\w+)` \|", table, re.M)) == sorted(
        name for name in TopicKeys.__dataclass_fields__ if name != "topic")
    meta_row = re.search(r"^\| `meta` \|.*$", table, re.M)[0]
    assert not {field.value for field in Meta} - set(re.findall(r"`(\w+)`", meta_row))
    paragraph = text[text.index("Per namespace (`dq:ns:<ns>:…`)"):].split("\n\n", 1)[0]
    keys = namespace_keys("ns")
    base = keys.topics.removesuffix("topics")
    names = {getattr(keys, name) for name in NamespaceKeys.__dataclass_fields__
             if name not in ("namespace", "history_pattern")} | {keys.scanner_alive("-"), keys.long_polls("-")}
    named = set(re.findall(r"`(\w+)(?::<[^>]+>)?`", paragraph))
    assert not {name.removeprefix(base).split(":")[0] for name in names} - named


SOURCES = [path for pattern in ("delayqueue/**/*.py", "project/*.py", "spark/*.py", "tools/*.py", "bench/*.py",
                                "delayqueue/live/lua/**/*.lua") for path in ROOT.glob(pattern)
           if "migrations" not in path.parts]  # a migration's comments describe the code of its day
SOURCE_MENTION = re.compile(r"(?<![\w./-])((?:[\w-]+/)+(?:[\w-]+\.(?:py|lua))?)(?![\w/])")


def test_every_file_the_code_names_exists():
    """As the docs': a `dir/name.py`, `name.lua` or `delayqueue/dir/` a comment or docstring names
    is a file (folder) of the repository, from the root, delayqueue/, the Lua folder, delayqueue's
    packages or the naming file's own folder."""
    bases = [*BASES, *(ROOT / "delayqueue").glob("*/")]
    missing = sorted(f"{path.relative_to(ROOT)}: {name}" for path in SOURCES
                     for name in SOURCE_MENTION.findall(path.read_text())
                     if (name.endswith((".py", ".lua")) or name.startswith("delayqueue/"))
                     and not any((base / name).exists() for base in [*bases, path.parent]))
    assert not missing, "\n".join(missing)
