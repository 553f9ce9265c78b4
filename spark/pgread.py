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
from psycopg import sql
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from delayqueue.messagelog.connection import EVENT_TABLE, MESSAGE_TABLE, first_line
from spark.common import JobError


@dataclass(frozen=True)
class Column:
    name: str
    expression: str  # SQL over the table's own columns
    pg_type: str  # the type COPY sends, for psycopg's binary loader
    spark_type: T.DataType


def epoch_ms(column: str) -> str:
    """The SQL for a timestamptz as epoch milliseconds, as delayqueue.messagelog.recovery computes it."""
    return f"(extract(epoch FROM {column}) * 1000)::int8"


# Per PostgreSQL column type (varchar counts as text): the SQL that sends a column of it (over
# the column's name), the type COPY sends and the Spark type.
PG_TYPES = {
    "int8": ("{}", "int8", T.LongType()),
    "int4": ("{}", "int4", T.IntegerType()),
    "int2": ("{}::int4", "int4", T.IntegerType()),  # smallint (statuses), widened like the int4 columns
    "text": ("{}", "text", T.StringType()),
    "timestamptz": (epoch_ms("{}"), "int8", T.LongType()),
}


def table_columns(**kinds: str) -> dict[str, Column]:
    """A table's columns, each declared by name and PostgreSQL type (a key of PG_TYPES)."""
    return {name: Column(name, PG_TYPES[kind][0].format(name), *PG_TYPES[kind][1:]) for name, kind in kinds.items()}


MESSAGE_COLUMNS = table_columns(
    id="int8", namespace="text", topic="text", msg_id="text", payload="text", produce_time="timestamptz",
    trigger_time="timestamptz", expire_time="timestamptz", max_retry="int4", retry="int4", status="int2",
    updated_at="timestamptz")

EVENT_COLUMNS = table_columns(
    id="int8", namespace="text", topic="text", msg_id="text", event_id="text", at="timestamptz",
    from_status="int2", to_status="int2", retry="int4", reason="text", process="text", host="text")


def id_ranges(low: int, high: int, parts: int) -> list[tuple[int, int]]:
    """[low, high] cut into at most `parts` contiguous half-open ranges covering it."""
    if low is None:
        return []
    span = high - low + 1
    parts = max(1, min(parts, span))
    bounds = [low + span * i // parts for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts) if bounds[i] < bounds[i + 1]]


def select(table: str, columns: list[Column], where: str) -> sql.Composed:
    """SELECT of the columns' expressions from `table` WHERE `where` (may hold %s placeholders)."""
    return sql.SQL("SELECT {} FROM {} WHERE ({})").format(
        sql.SQL(", ").join(sql.SQL(c.expression) for c in columns), sql.Identifier(table), sql.SQL(where))


def stream(dsn: str, query: str, columns: list[Column], params: tuple):
    """Runs on an executor: the query's rows as tuples, streamed with a binary COPY."""
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        with conn.cursor() as cur:
            with cur.copy(f"COPY ({query}) TO STDOUT (FORMAT BINARY)", params) as copy:
                copy.set_types([c.pg_type for c in columns])
                yield from copy.rows()


def _read_range(dsn: str, query: str, columns: list[Column], params: tuple, id_range: tuple[int, int]):
    return stream(dsn, query, columns, (*params, *id_range))


def read_table(spark: SparkSession, dsn: str, table: str, columns: dict[str, Column], names: list[str], *,
               where: str = "TRUE", params: tuple = (), partitions: int) -> DataFrame:
    """The rows of `table` matching `where` (SQL with %s placeholders for `params`), with the
    named columns, as a DataFrame read in `partitions` id ranges."""
    chosen = [columns[n] for n in names]
    bounds = sql.SQL("SELECT min(id), max(id) FROM {} WHERE {}").format(sql.Identifier(table), sql.SQL(where))
    try:
        with psycopg.connect(dsn, connect_timeout=10) as conn:
            low, high = conn.execute(bounds, params).fetchone()
            query = (select(table, chosen, where) + sql.SQL(" AND id >= %s AND id < %s")).as_string(conn)
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
    return read_table(spark, dsn, MESSAGE_TABLE, MESSAGE_COLUMNS, names, **kwargs)


def read_events(spark, dsn, names, **kwargs) -> DataFrame:
    return read_table(spark, dsn, EVENT_TABLE, EVENT_COLUMNS, names, **kwargs)
