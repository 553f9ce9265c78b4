"""`./dev run` installs only `.[local]`: the service's processes (uvicorn on project.asgi, every
management command, ./dev itself) must run without what only the test, bench and spark extras
bring. Checked in a process where those packages cannot be imported at all."""
import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions

from packaging.requirements import Requirement

from tests.helpers import ROOT


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def installed_with(extras: set[str]) -> set[str]:
    """The distributions `pip install .[extras]` brings, by the installed packages' metadata."""
    seen: set[str] = set()
    todo = [("delayqueue", frozenset(extras))]
    while todo:
        name, wanted = todo.pop()
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:  # an optional dependency not installed here
            continue
        seen.add(canonical(name))
        for line in requires:
            requirement = Requirement(line)
            if requirement.marker and not any(requirement.marker.evaluate({"extra": e}) for e in wanted or {""}):
                continue
            if canonical(requirement.name) not in seen:
                todo.append((requirement.name, frozenset(requirement.extras)))
    return seen


IMPORT_THE_SERVICE = """
import importlib.abc, importlib.util, sys
BLOCKED = set(sys.argv[1].split(","))

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (not installed by .[local])", name=name)

sys.meta_path.insert(0, Blocker())
# Probes for optional packages (yarl's for pydantic_core) see them absent, as when not installed.
probe = importlib.util.find_spec
importlib.util.find_spec = lambda name, package=None: None if name.split(".")[0] in BLOCKED else probe(name, package)
import tools.stack
import project.asgi
from django.urls import get_resolver
from django.core.management import get_commands, load_command_class
get_resolver().url_patterns  # every view
for command, app in get_commands().items():
    load_command_class(app, command)
print("imported")
"""


def test_the_service_and_its_commands_import_nothing_that_only_the_test_bench_or_spark_extras_install():
    extra_only = installed_with({"local", "test", "bench", "spark"}) - installed_with({"local"})
    assert {"pytest", "pyspark", "huey"} <= extra_only  # the walk read the extras
    modules = {module for module, dists in packages_distributions().items()
               if any(canonical(d) in extra_only for d in dists)}
    ran = subprocess.run([sys.executable, "-c", IMPORT_THE_SERVICE, ",".join(sorted(modules))], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and ran.stdout.strip() == "imported", ran.stderr


def test_the_spark_jobs_import_without_django_set_up():
    """Spark's executors import the jobs' modules in a bare Python: nothing they import (the
    runtime, the restore service, the SQL) may need Django's app registry, as the models do."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    ran = subprocess.run([sys.executable, "-c", "import sys, spark.restore, spark.reconcile, spark.stats, spark.archive; "
                          "print('delayqueue.models' in sys.modules)"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert ran.returncode == 0 and ran.stdout.strip() == "False", ran.stderr
