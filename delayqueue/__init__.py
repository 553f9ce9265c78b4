"""delayqueue: a delay-queue service on Redis (the live queue) and PostgreSQL (the message log).

The package is built in layers. A module imports from its own layer and the layers below it,
never from one above, and no import (at module level, inside a function or for type checking
only) closes a circle; tests/unit/test_imports.py holds every module to LAYERS.
docs/architecture.md describes each layer."""

# Bottom first: each layer, and the modules (and packages, with everything inside) it holds.
LAYERS = (
    ("core", ("delayqueue.core",)),
    ("config", ("delayqueue.config",)),
    ("live", ("delayqueue.live",)),
    ("messagelog", ("delayqueue.messagelog", "delayqueue.models", "delayqueue.migrations")),
    ("stores", ("delayqueue.stores",)),
    ("runtime", ("delayqueue.runtime",)),
    ("services", ("delayqueue.services",)),
    ("workers", ("delayqueue.workers",)),
    ("api", ("delayqueue.api",)),
    ("ops", ("delayqueue.ops", "delayqueue.templatetags")),
    ("commands", ("delayqueue.management", "delayqueue.apps")),
)
