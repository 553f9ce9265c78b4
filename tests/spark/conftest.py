"""Spark for the spark/ job tests: one local[2] SparkSession for the whole run, and a standalone
cluster (a master and a worker on localhost, started from pyspark's own launch classes) only
for the test that spark-submits a job onto it. Each worker offers two cores and an application
takes at most two."""
import logging
import os
import sys

import pytest

from tests.helpers import require_servers

from .helpers import LOCAL_IP, StandaloneCluster

require_servers()


@pytest.fixture(scope="session")
def spark():
    """The SparkSession the jobs run on, in this process (local[2])."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    logging.getLogger("py4j").setLevel(logging.WARNING)  # its goodbye at exit, after pytest closed stderr
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("delayqueue-tests")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.host", LOCAL_IP).config("spark.driver.bindAddress", LOCAL_IP)
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    """A standalone Spark cluster's master URL."""
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"))
    yield cluster.url
    cluster.stop()
