"""PySpark batch jobs over the PostgreSQL message log: stats, restore, reconcile, archive.

Each job is a module runnable as `python -m spark.<job>` and `spark-submit spark/<job>.py`;
see spark/README.md.
"""
