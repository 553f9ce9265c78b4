"""PostgreSQL, the message log: its tables (tables.py, with models.py, which Django keeps at the
package's top), every SQL statement (sql.py), its connections, the send path's group commit,
dead-letter rows, retention and the admin's reads. Imports core, config and live (whose records
its statements read)."""
