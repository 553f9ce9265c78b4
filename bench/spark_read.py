"""The psycopg partitioned log reader alone: reads every history row (the stats job's columns)
into Spark and counts them. Run by bench.spark_jobs; DATABASE_URL names the log."""
import argparse
import os

from spark import common, pgread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--partitions", type=int, default=8)
    args = parser.parse_args()
    spark = common.session("bench-read", args.master)
    try:
        events = pgread.read_events(spark, os.environ["DATABASE_URL"],
                                    ["namespace", "topic", "msg_id", "at", "from_status", "to_status", "reason"],
                                    partitions=args.partitions)
        print(f"read {events.count():,} rows in {args.partitions} partitions")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
