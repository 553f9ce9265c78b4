"""Issue 27's open design question, measured: the message table as it is against one partitioned by
trigger_time (hourly) with a table of natural keys beside it, which is what a partitioned log
needs for msgId dedupe and for the writes that find a row by msgId (PostgreSQL keeps a partitioned
table's unique keys only with the partition key in them). Copies of the table's columns and
indexes in a scratch, durable PostgreSQL, one connection: inserts of `--rows` rows due over 48 h
(batches of 1,000, as the group commit sends them), status updates by natural key, a loader's
read of one minute, and retention of one hour (DELETE against dropping the partition).

    .venv/bin/python -m bench.partitioned_log [--rows 200000]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone

import psycopg

from bench.harness import ROOT, scratch_services
from delayqueue.messagelog import tables
from tools.stack import free_port

BATCH = 1000
HOURS = 48
BASE = datetime(2026, 12, 1, tzinfo=timezone.utc)

COLS = ("namespace, topic, msg_id, payload, produce_time, trigger_time, expire_time, max_retry, retry, status, "
        "priority, updated_at")
REC = ("json_to_recordset(%s::json) AS u(msg_id text, trigger_time int8)")
SELECT = ("SELECT 'default', 'orders', u.msg_id, repeat('x', 100), now(), to_timestamp(u.trigger_time / 1000.0),"
          " to_timestamp(u.trigger_time / 1000.0) + interval '1 hour', 10, 0, 1, 0, now() FROM " + REC)


def setup(conn):
    conn.execute(f"CREATE TABLE plain (LIKE {tables.MESSAGE} INCLUDING ALL)")
    conn.execute(f"CREATE TABLE part (LIKE {tables.MESSAGE} INCLUDING DEFAULTS INCLUDING IDENTITY)"
                 " PARTITION BY RANGE (trigger_time)")
    conn.execute("ALTER TABLE part ADD PRIMARY KEY (id, trigger_time)")
    # The message table's indexes but its unique natural key, which moves to part_key.
    for name, definition in conn.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s"
                                         " AND indexdef NOT LIKE 'CREATE UNIQUE %%'", [tables.MESSAGE]).fetchall():
        conn.execute(definition.replace(f"INDEX {name} ON public.{tables.MESSAGE}", f"INDEX part_{name} ON part"))
    for h in range(HOURS + 1):
        lo, hi = BASE + timedelta(hours=h), BASE + timedelta(hours=h + 1)
        conn.execute(f"CREATE TABLE part_h{h} PARTITION OF part"
                     f" FOR VALUES FROM ('{lo.isoformat()}') TO ('{hi.isoformat()}')")
    conn.execute("CREATE TABLE part_key (msg_id varchar(256), topic varchar(255), namespace varchar(128), id bigint,"
                 " trigger_time timestamptz, PRIMARY KEY (msg_id, topic, namespace))")


def batches(rows):
    for i in range(0, len(rows), BATCH):
        yield json.dumps(rows[i:i + BATCH])


def timed(label, conn, statement, rows):
    start = time.perf_counter()
    for doc in batches(rows):
        conn.execute(statement, [doc])
    took = time.perf_counter() - start
    print(f"{label}: {len(rows) / took:,.0f} rows/s ({took * 1e6 / len(rows):.1f} µs a row)", flush=True)
    return took


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    rows_count = parser.parse_args().rows
    with scratch_services("bench-", durable=True) as services:
        env = dict(os.environ, DATABASE_URL=services.postgres(free_port()), DJANGO_SETTINGS_MODULE="bench.settings",
                   SECRET_KEY="bench")
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
        with psycopg.connect(env["DATABASE_URL"], autocommit=True) as conn:
            setup(conn)
            start_ms = int(BASE.timestamp() * 1000)
            rows = []
            for _ in range(rows_count):  # time-ordered msgIds, as the service's (version 7 UUIDs)
                rows.append({"msg_id": str(uuid.UUID(int=(time.time_ns() // 1_000_000) << 80 | random.getrandbits(80))),
                             "trigger_time": start_ms + random.randrange(HOURS * 3_600_000)})
            for round_ in range(2):
                half = rows[round_ * rows_count // 2:(round_ + 1) * rows_count // 2]
                timed(f"insert plain (round {round_})", conn, f"INSERT INTO plain ({COLS}) {SELECT}", half)
                timed(f"insert partitioned + key (round {round_})", conn,
                      f"WITH ins AS (INSERT INTO part ({COLS}) {SELECT} RETURNING id, msg_id, topic, namespace,"
                      " trigger_time) INSERT INTO part_key SELECT msg_id, topic, namespace, id, trigger_time FROM ins",
                      half)
            conn.execute("ANALYZE plain; ANALYZE part; ANALYZE part_key")
            sample = random.sample(rows, 50_000)
            for round_ in range(2):
                timed(f"status update by key, plain (round {round_})", conn,
                      "UPDATE plain m SET status = 2, updated_at = now() FROM " + REC +
                      " WHERE m.msg_id = u.msg_id AND m.topic = 'orders' AND m.namespace = 'default'", sample)
                timed(f"status update by key, partitioned (round {round_})", conn,
                      "UPDATE part m SET status = 2, updated_at = now() FROM " + REC +
                      " JOIN part_key k ON k.msg_id = u.msg_id AND k.topic = 'orders' AND k.namespace = 'default'"
                      " WHERE m.id = k.id AND m.trigger_time = k.trigger_time", sample)
            for table in ("plain", "part", "part_key"):
                size = conn.execute("SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c"
                                    " LEFT JOIN pg_inherits i ON i.inhrelid = c.oid"
                                    " WHERE c.relname = %s OR i.inhparent = %s::regclass", [table, table]).fetchone()[0]
                print(f"{table}: {size / rows_count:.0f} bytes a row (table and indexes)")
            window = (BASE + timedelta(hours=10), BASE + timedelta(hours=10, minutes=1))
            for table in ("plain", "part"):
                start = time.perf_counter()
                for _ in range(20):
                    conn.execute(f"SELECT id, msg_id FROM {table} WHERE namespace = 'default' AND topic = 'orders'"
                                 " AND status = 1 AND trigger_time > %s AND trigger_time <= %s"
                                 " ORDER BY trigger_time, id", window).fetchall()
                print(f"loader read of a minute, {table}: {(time.perf_counter() - start) / 20 * 1000:.2f} ms")
            hour = (BASE + timedelta(hours=5), BASE + timedelta(hours=6))
            start = time.perf_counter()
            n = conn.execute("DELETE FROM plain WHERE trigger_time >= %s AND trigger_time < %s", hour).rowcount
            print(f"retention of an hour ({n} rows): DELETE {time.perf_counter() - start:.3f} s", flush=True)
            start = time.perf_counter()
            conn.execute("DELETE FROM part_key WHERE trigger_time >= %s AND trigger_time < %s", hour)
            conn.execute("DROP TABLE part_h5")
            print(f"  partitioned: key rows DELETE + DROP TABLE {time.perf_counter() - start:.3f} s")


if __name__ == "__main__":
    main()
