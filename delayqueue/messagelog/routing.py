"""Which PostgreSQL database holds a namespace's rows: its messages, their history, its hourly
stats, settings, schedules and redrives. DELAYQUEUE_NAMESPACE_DATABASES routes a namespace to an
alias of DELAYQUEUE_LOG_DATABASES; the others, and what belongs to no one namespace (API tokens,
the admin's users and sessions), stay in DATABASE_URL's (`default`). Each database has every
table (`manage.py migrate --database <alias>`), so one log's statements run unchanged on any."""
from delayqueue.config.settings import load_config


def database_of(namespace: str) -> str:
    """The alias of the database that holds `namespace`'s rows, by the process' settings."""
    return load_config().log_database_of(namespace)


def by_database(namespaces: list[str]) -> dict[str, list[str]]:
    """The namespaces grouped by the database that holds their rows, in the order given."""
    grouped: dict[str, list[str]] = {}
    for namespace in namespaces:
        grouped.setdefault(database_of(namespace), []).append(namespace)
    return grouped


def log_databases() -> list[str]:
    """Every database that holds some namespace's rows: `default` first."""
    return list(load_config().database_urls)


class NamespaceRouter:
    """Django's routing of a model instance to its namespace's database (the admin's saves and
    deletes, and any ORM write given an instance). Reads of a namespace name their database
    (`.using(database_of(...))`), as a query's filter is no hint Django hands a router; so does
    `objects.create()`, which gives none. A row without a namespace of its own (a schedule's gap)
    stays in the database it was read from."""

    def _database(self, model, **hints) -> str | None:
        instance = hints.get("instance")
        if instance is None or model._meta.app_label != "delayqueue" or model._meta.model_name == "apitoken":
            return None
        namespace = getattr(instance, "namespace", None)
        return database_of(namespace) if namespace else instance._state.db

    db_for_read = _database
    db_for_write = _database
