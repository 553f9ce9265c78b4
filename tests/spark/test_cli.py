"""The jobs' command lines: bad input fails in one line, before any write; spark-submit works."""
import sys

import pytest

from delayqueue.models import TopicHourStats
from tests.helpers import ROOT, log_database_url

from .helpers import SPARK_HOME, run_cli, stats_log

# Every test here runs a job as its own process.
pytestmark = pytest.mark.process

NO_PG = "postgres://postgres@127.0.0.1:1/delayqueue"
NO_REDIS = "redis://127.0.0.1:1/0"


def one_line_error(result, code: int, *fragments: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, result.stderr
    assert len(lines) == 1 and all(f in lines[0] for f in fragments), result.stderr


@pytest.mark.parametrize("job, argv, fragment", [
    ("spark.stats", ["--bogus"], "unrecognized arguments: --bogus"),
    ("spark.stats", ["--since", "yesterday"], "--since: not a date"),
    ("spark.restore", ["--partitions", "0"], "--partitions: must be at least 1"),
    ("spark.stats", ["--partitions", "10001"], "--partitions: must be at most 10000, got 10001"),
    ("spark.reconcile", ["--topic", "bad\ttopic"], "--topic: 'bad\\ttopic': a topic must be"),
    ("spark.restore", ["--msg-id", "bad\x01id"], "--msg-id: 'bad\\x01id': a msgId must be"),
    ("spark.archive", ["--to", "/tmp/x"], "the following arguments are required: --older-than-days"),
    ("spark.archive", ["--to", "/tmp/x", "--older-than-days", "36501"], "--older-than-days: must be at most 36500 days"),
    # One the service refuses (its Redis keys): a restore wrote keys under it that nothing reads.
    ("spark.restore", ["--namespace", "a{b}"], "--namespace: not a namespace: must be 1-64 of"),
    ("spark.stats", ["--namespace", "\udcff"], "--namespace: not a namespace"),
])
def test_a_wrong_option_exits_2_with_one_line(job, argv, fragment):
    one_line_error(run_cli(job, *argv), 2, fragment)


@pytest.mark.parametrize("url", ["s3a://bucket/archive", "hdfs://namenode:8020/archive"])
def test_archive_refuses_a_url_as_its_target(url):
    result = run_cli("spark.archive", "--database-url", NO_PG, "--to", url, "--older-than-days", "7")
    one_line_error(result, 2, "argument --to: must be a directory path", f"not a URL: '{url}'")


def test_unreachable_servers_and_missing_tables_fail_in_one_line_before_any_write(tmp_path, db):
    target = tmp_path / "archive"
    one_line_error(run_cli("spark.archive", "--database-url", NO_PG, "--to", str(target), "--older-than-days", "7"),
                   1, "cannot use PostgreSQL", "127.0.0.1")
    without_tables = log_database_url().rsplit("/", 1)[0] + "/postgres"  # the server's own database: no tables
    one_line_error(run_cli("spark.archive", "--database-url", without_tables, "--to", str(target), "--older-than-days", "7"),
                   1, "table delayqueue_message does not exist")
    assert not target.exists()
    one_line_error(run_cli("spark.restore", "--database-url", log_database_url(), "--redis-url", NO_REDIS),
                   1, "cannot reach Redis at redis://127.0.0.1:1/0")
    one_line_error(run_cli("spark.reconcile", "--database-url", log_database_url(),
                           "--redis-url", "redis-cluster://127.0.0.1:1,127.0.0.1:2"), 1, "cannot reach Redis")
    one_line_error(run_cli("spark.stats", "--database-url", without_tables), 1, "does not exist")
    one_line_error(run_cli("spark.reconcile", "--database-url", log_database_url(), "--output", str(tmp_path)),
                   1, "already exists")
    (tmp_path / "a-file").write_text("")
    one_line_error(run_cli("spark.reconcile", "--database-url", log_database_url(),
                           "--output", str(tmp_path / "a-file" / "out")), 1, "--output", "cannot create or write")


SHOW_UI = "from spark.common import session; print(session('probe', 'local[1]').sparkContext.uiWebUrl)"


def test_a_job_started_with_python_serves_no_spark_ui_unless_asked():
    # The Spark UI listens on every interface and asks no one for a password (it shows the job's
    # environment and kills its stages): a job started by `python -m` runs without it.
    shown = run_cli("spark.common", command=[sys.executable, "-c", SHOW_UI])
    assert (shown.returncode, shown.stdout.strip()) == (0, "None"), shown.stderr
    asked = run_cli("spark.common", command=[sys.executable, "-c", SHOW_UI],
                    env={"PYSPARK_SUBMIT_ARGS": "--conf spark.ui.enabled=true --conf spark.ui.port=0 pyspark-shell"})
    assert asked.returncode == 0 and asked.stdout.startswith("http://"), asked.stderr


# The one test on the standalone cluster: the rest run on local[2], where the jobs do the same.
def test_spark_submit_runs_a_job_on_the_standalone_cluster(spark_cluster, clean_state):
    stats_log()
    result = run_cli("spark.stats", "--database-url", log_database_url(), env={"PYSPARK_PYTHON": sys.executable},
                     command=[str(SPARK_HOME / "bin" / "spark-submit"), "--master", spark_cluster,
                              "--conf", "spark.cores.max=2", "--conf", "spark.executor.memory=512m",
                              "--conf", "spark.ui.enabled=false", str(ROOT / "spark" / "stats.py")])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "stats: wrote 3 topic-hours" in result.stdout
    assert TopicHourStats.objects.get(namespace="default", topic="orders", hour__gte="2026-11-20T10:00Z").sent == 100
