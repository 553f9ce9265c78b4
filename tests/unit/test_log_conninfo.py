"""The message log's own connections take DATABASE_URL's libpq parameters (TLS to an external
PostgreSQL), as Django's connection does, and leave Django's own options out."""
from django.db import connections
from psycopg.conninfo import conninfo_to_dict

from delayqueue.messagelog.connection import conninfo


def test_libpq_parameters_of_the_url_reach_the_log_connection(monkeypatch):
    settings = connections["default"].settings_dict
    monkeypatch.setitem(settings, "OPTIONS", {"sslmode": "verify-full", "sslrootcert": "/etc/ssl/db-ca.pem",
                                              "pool": True, "isolation_level": 1})
    monkeypatch.setitem(settings, "HOST", "db.internal")
    params = conninfo_to_dict(conninfo(500, "default"))
    assert params["sslmode"] == "verify-full" and params["sslrootcert"] == "/etc/ssl/db-ca.pem"
    assert params["host"] == "db.internal" and params["options"] == "-c statement_timeout=500"
    assert "pool" not in params and "isolation_level" not in params
