"""What every job shares: its command line, the checks made before any write, and the session.

A job module defines `add_arguments(parser)`, `preflight(args)` (checks options and reaches
PostgreSQL and Redis; raises JobError) and `run(spark, args)`. `main()` puts them together, so
bad options and unreachable servers fail in a second, with one line and before a JVM starts.
"""
import argparse
import importlib
import os
import sys
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path

import psycopg
import redis

from delayqueue.config.arguments import namespace_name, positive_int
from delayqueue.config.redis_urls import (is_cluster_url, is_sentinel_url, sentinel_target, url_credentials, url_nodes,
                                          without_password)
from delayqueue.config.settings import SETTINGS, QueueConfig
from delayqueue.messagelog import sql
from delayqueue.messagelog.connection import first_line


class JobError(Exception):
    """A failure the user can fix (bad server address, missing table): one line, exit code 1."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a wrong option prints one line (not the usage block) and exits 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parser(prog: str, description: str) -> OneLineParser:
    p = OneLineParser(prog=prog, description=description)
    p.add_argument("--master", help="Spark master URL (default: what spark-submit set, else local[*])")
    # Defaults as the service reads them: the same variables, defaults and checks.
    p.add_argument("--database-url",
                   help="the message log (default: the database of --namespace: $DATABASE_URL, or the one "
                        "$DELAYQUEUE_NAMESPACE_DATABASES routes it to). Prefer the variable: an option is visible "
                        "to every user of this machine in the process list (ps), its password too")
    p.add_argument("--namespace", type=namespace_name, default=SETTINGS["namespace"].read(),
                   help="delayqueue namespace (default: $DELAYQUEUE_NAMESPACE or 'default')")
    return p


def log_config() -> QueueConfig:
    """The message log's databases and the namespaces' routes, as the service reads them."""
    return QueueConfig(**{name: SETTINGS[name].read() for name in ("database_url", "log_databases",
                                                                    "namespace_databases")})


def add_redis_url(p: argparse.ArgumentParser) -> None:
    p.add_argument("--redis-url", default=SETTINGS["redis_url"].read(),
                   help="the live queue: redis://, rediss://, unix://, redis-cluster://h:p,h:p or "
                        "redis+sentinel://h:p,h:p/service (default: $REDIS_URL; prefer it: ps shows options)")


# Each id range is one PostgreSQL connection and one task: far more than a cluster's cores only adds overhead.
MAX_PARTITIONS = 10_000


def partition_count(text: str) -> int:
    value = positive_int(text)
    if value > MAX_PARTITIONS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_PARTITIONS}, got {value}")
    return value


def add_partitions(p: argparse.ArgumentParser) -> None:
    p.add_argument("--partitions", type=partition_count, default=0,
                   help=f"how many id ranges the log is read in, at most {MAX_PARTITIONS} "
                        "(default: 4 per core Spark has)")


def chunks(items: Iterable, size: int) -> Iterator[list]:
    """The items in consecutive lists of `size` (the last may be shorter), consumed lazily."""
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def query(dsn: str, statement, params) -> list[tuple]:
    """A small query on the driver; JobError if PostgreSQL fails."""
    try:
        with psycopg.connect(dsn, connect_timeout=10) as conn:
            return conn.execute(statement, params).fetchall()
    except psycopg.Error as exc:
        raise JobError(f"cannot query PostgreSQL: {first_line(exc)}") from None


def check_postgres(dsn: str, tables: tuple[str, ...]) -> None:
    """Connects to PostgreSQL and checks the tables exist; JobError otherwise."""
    try:
        with psycopg.connect(dsn, connect_timeout=5, autocommit=True) as conn:
            for table in tables:
                if conn.execute(sql.TABLE_EXISTS, (table,)).fetchone()[0] is None:
                    raise JobError(f"table {table} does not exist in database {conn.info.dbname!r} "
                                   "(run manage.py migrate)")
    except psycopg.Error as exc:
        raise JobError(f"cannot use PostgreSQL: {first_line(exc)}") from None


def check_writable(option: str, path: Path) -> None:
    """A directory the job creates or writes into: its nearest existing ancestor (or itself) must
    be a directory it can write; JobError otherwise, before Spark starts."""
    existing = next((p for p in [path, *path.parents] if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK):
        raise JobError(f"{option} {path}: cannot create or write {existing}")


def sync_redis(url: str):
    """A blocking client (executors have no event loop to share) for the URL forms delayqueue accepts."""
    if is_cluster_url(url):
        return redis.RedisCluster(startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in url_nodes(url)],
                                  decode_responses=True, socket_timeout=30, **url_credentials(url))
    if is_sentinel_url(url):
        service, db, sentinel_auth = sentinel_target(url)
        sentinel = redis.sentinel.Sentinel(url_nodes(url), sentinel_kwargs={"socket_timeout": 30, **sentinel_auth})
        return sentinel.master_for(service, db=db, decode_responses=True, socket_timeout=30, **url_credentials(url))
    return redis.Redis.from_url(url, decode_responses=True, socket_timeout=30)


def check_redis(url: str) -> None:
    try:
        client = sync_redis(url)
        try:
            client.ping()
        finally:
            client.close()
    except (redis.RedisError, redis.exceptions.RedisClusterException, OSError, ValueError) as exc:
        raise JobError(f"cannot reach Redis at {without_password(url)}: {first_line(exc)}") from None


# The Spark UI listens on every interface and asks no one for a password (it shows the job's
# environment and kills its stages): off in a driver started here, unless PYSPARK_SUBMIT_ARGS names it.
UI_SETTING = "spark.ui.enabled"


def session(app: str, master: str | None):
    """The SparkSession. Executors run this interpreter unless PYSPARK_PYTHON says otherwise, so
    they can import delayqueue, psycopg and redis as the driver does."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(f"delayqueue-{app}").config("spark.sql.session.timeZone", "UTC")
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit sets the master and the UI itself
    if master:
        builder = builder.master(master)
    elif not under_submit:
        builder = builder.master("local[*]")
    if not under_submit and UI_SETTING not in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        builder = builder.config(UI_SETTING, "false")
    return builder.getOrCreate()


def default_partitions(spark, requested: int) -> int:
    return requested or 4 * spark.sparkContext.defaultParallelism


def parse_args(module_name: str, argv: list[str] | None):
    """The job module and its parsed command line. Without --database-url, `database_url` is the
    database of --namespace, and `database_urls` every database (for a job over all namespaces)."""
    job = importlib.import_module(module_name)
    prog = module_name.replace(".", "/") + ".py"
    p = parser(prog, job.__doc__.strip().splitlines()[0])
    job.add_arguments(p)
    args = p.parse_args(argv)
    if args.database_url is None:
        try:
            config = log_config()
        except ValueError as exc:
            raise SystemExit(f"{prog}: error: {exc}") from None
        args.database_url = config.database_urls[config.log_database_of(args.namespace)]
        args.database_urls = list(dict.fromkeys(config.database_urls.values()))
    else:
        args.database_urls = [args.database_url]
    return job, args


def main(module_name: str, argv: list[str] | None = None) -> int:
    """Parse, check, run. Imports the job by name, so that under spark-submit (where the file is
    __main__) the functions Spark ships to executors are pickled by reference to their module."""
    job, args = parse_args(module_name, argv)
    prog = module_name.replace(".", "/") + ".py"
    try:
        job.preflight(args)
        spark = session(module_name.rsplit(".", 1)[-1], args.master)
        try:
            job.run(spark, args)
        finally:
            spark.stop()
    except JobError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    return 0
