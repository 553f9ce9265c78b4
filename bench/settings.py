"""The service's own settings plus a bare hello-world view, for throughput comparisons."""
from project.settings import *  # noqa: F401,F403

ROOT_URLCONF = "bench.urls"
