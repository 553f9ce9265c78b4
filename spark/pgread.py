"""Reads a message-log table into Spark in parallel id ranges, with psycopg on the executors.

The driver asks PostgreSQL for the id bounds of the selected rows and cuts them into equal
ranges; each Spark task opens its own connection and streams its range with
`COPY (SELECT ...) TO STDOUT (FORMAT BINARY)`. Times leave PostgreSQL as epoch milliseconds
(bigint), the unit Redis and the HTTP API use. spark/README.md explains why this rather than
Spark's JDBC source.
"""
from dataclasses import dataclass
from functools import partial

import psycopg
from psycopg.sql import Composable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from delayqueue.messagelog import sql, tables
from delayqueue.messagelog.connection import first_line
from spark.common import JobError


@dataclass(frozen=True)
class Column:
    name: str
    expression: str  # SQL over the table's own columns
    pg_type: str  # the type COPY sends, for psycopg's binary loader
    spark_type: T.DataType


# Per PostgreSQL column type (varchar counts as text): the type COPY sends (sql.spark_column's
# expression of it) and the Spark type.
PG_TYPES = {
    "int8": ("int8", T.LongType()),
    "int4": ("int4", T.IntegerType()),
    "int2": ("int4", T.IntegerType()),
    "text": ("text", T.StringType()),
    "timestamptz": ("int8", T.LongType()),
}


def table_columns(**kinds: str) -> dict[str, Column]:
    """A table's columns, each declared by name and PostgreSQL type (a key of PG_TYPES)."""
    return {name: Column(name, sql.spark_column(name, kind), *PG_TYPES[kind]) for name, kind in kinds.items()}


MESSAGE_COLUMNS = table_columns(
    id="int8", namespace="text", topic="text", msg_id="text", payload="text", produce_time="timestamptz",
    trigger_time="timestamptz", expire_time="timestamptz", max_retry="int4", retry="int4", status="int2",
    priority="int2", updated_at="timestamptz", started_us="int8")

EVENT_COLUMNS = table_columns(
    id="int8", namespace="text", topic="text", msg_id="text", event_id="text", at="timestamptz",
    from_status="int2", to_status="int2", retry="int4", reason="text", process="text", host="text", detail="text",
    trigger_time="timestamptz", expire_time="timestamptz", produce_time="timestamptz")


def id_ranges(low: int, high: int, parts: int) -> list[tuple[int, int]]:
    """[low, high] cut into at most `parts` contiguous half-open ranges covering it."""
    if low is None:
        return []
    span = high - low + 1
    parts = max(1, min(parts, span))
    bounds = [low + span * i // parts for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts) if bounds[i] < bounds[i + 1]]


def stream(dsn: str, query: str, columns: list[Column], params: dict):
    """Runs on an executor: the rows of a binary COPY (messagelog.sql's copy_*), as tuples."""
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        with conn.cursor() as cur:
            with cur.copy(query, params) as copy:
                copy.set_types([c.pg_type for c in columns])
                yield from copy.rows()


def _read_range(dsn: str, query: str, columns: list[Column], params: dict, id_range: tuple[int, int]):
    return stream(dsn, query, columns, {**params, "low": id_range[0], "high": id_range[1]})


def read_table(spark: SparkSession, dsn: str, table: str, columns: dict[str, Column], names: list[str], *,
               where: Composable = sql.ALL, params: dict | None = None, partitions: int) -> DataFrame:
    """The rows of `table` matching `where` (a condition of messagelog.sql, with named
    placeholders for `params`), with the named columns, as a DataFrame read in `partitions` id ranges."""
    chosen, params = [columns[n] for n in names], params or {}
    try:
        with psycopg.connect(dsn, connect_timeout=10) as conn:
            low, high = conn.execute(sql.id_bounds(table, where), params).fetchone()
            query = sql.copy_id_range(table, [c.expression for c in chosen], where).as_string(conn)
    except psycopg.Error as exc:
        raise JobError(f"cannot read {table}: {first_line(exc)}") from None
    ranges = id_ranges(low, high, partitions)
    schema = T.StructType([T.StructField(c.name, c.spark_type, nullable=False) for c in chosen])
    if not ranges:
        return spark.createDataFrame([], schema)
    rows = spark.sparkContext.parallelize(ranges, len(ranges)).flatMap(
        partial(_read_range, dsn, query, chosen, params))
    return spark.createDataFrame(rows, schema, verifySchema=False)


def read_messages(spark, dsn, names, **kwargs) -> DataFrame:
    return read_table(spark, dsn, tables.MESSAGE, MESSAGE_COLUMNS, names, **kwargs)


def read_events(spark, dsn, names, **kwargs) -> DataFrame:
    return read_table(spark, dsn, tables.EVENT, EVENT_COLUMNS, names, **kwargs)
