"""The docs name only series /metrics exports, and the README names every one. Each
`delayqueue_...{labels}` or `...[range]` the docs write (PromQL, or a series with its labels) is a
sample name of a family ops/metrics.py collects (a counter's ends in _total), or a histogram's own
name. The SDK's delayqueue_client_* are its own."""
import re

from delayqueue.ops.metrics import Snapshot
from tests.helpers import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SERIES = re.compile(r"\b(delayqueue_(?!client_)\w+)[{\[]")
HISTOGRAM_SAMPLES = ("_bucket", "_sum", "_count")


def exported() -> set[str]:
    names = set()
    for family in Snapshot([], dead={}, counted=set()).collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names |= {family.name, *(family.name + suffix for suffix in HISTOGRAM_SAMPLES)}
        else:
            names.add(family.name)
    return names


def test_the_docs_name_only_exported_series():
    names = exported()
    unknown = sorted({f"{doc.relative_to(ROOT)}: {name}" for doc in DOCS for name in SERIES.findall(doc.read_text())
                      if name not in names})
    assert not unknown, "\n".join(unknown)


def test_the_readme_names_every_exported_series():
    readme = (ROOT / "README.md").read_text()
    families = {name for name in exported() if not name.endswith(HISTOGRAM_SAMPLES)}
    assert not sorted(name for name in families if name not in readme)
