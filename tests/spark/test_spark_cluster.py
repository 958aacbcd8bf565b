"""`outboxq spark run` on a real Spark standalone cluster (a master and one worker from the PySpark
distribution, on 127.0.0.1), with a processor module that only the driver's import path has."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from decimal import Decimal

import pytest

from tests.spark_support import (
    enqueue_orders,
    order_payloads,
    spark_env,
    spark_run_command,
    statuses,
    table_rows,
)
from tests.support import wait_for

pytestmark = pytest.mark.spark

# Its UDF calls region_of on the executors, which import this module to unpickle it (a module-level
# function is pickled by reference): only the consumer's shipping (addPyFile) gets the module there.
PROCESSOR_MODULE = '''
from pyspark.sql import functions as F
from pyspark.sql.types import StringType


def region_of(customer):
    return "even" if int(customer[1:]) % 2 == 0 else "odd"


def region_totals(jobs):
    region = F.udf(region_of, StringType())
    return jobs.groupBy(region("customer").alias("region")).agg(
        F.count("*").alias("orders"), F.sum(F.col("amount").try_cast("decimal(14,2)")).alias("total"))
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive_workers(web_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/json/", timeout=2) as response:
            return json.load(response)["aliveworkers"]
    except OSError:
        return 0


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory) -> Iterator[str]:
    """A Spark standalone master and one worker (1 core, 1 GiB) on 127.0.0.1; the master URL."""
    import pyspark

    spark_home = os.path.dirname(pyspark.__file__)
    logs = tmp_path_factory.mktemp("cluster")
    env = {**os.environ, "SPARK_HOME": spark_home, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    port, web_port, worker_web_port = _free_port(), _free_port(), _free_port()
    spark_class = os.path.join(spark_home, "bin", "spark-class")
    commands = {
        "master": [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                   "--port", str(port), "--webui-port", str(web_port)],
        "worker": [spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
                   "--host", "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", str(worker_web_port),
                   "--work-dir", str(logs / "work")],
    }
    processes = []
    try:
        for name, command in commands.items():
            with open(logs / f"{name}.log", "w") as log:
                processes.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                  start_new_session=True))
        wait_for(lambda: _alive_workers(web_port) == 1, timeout=90, interval=0.5)
        yield f"spark://127.0.0.1:{port}"
    finally:
        for process in reversed(processes):
            os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


def test_spark_run_on_a_standalone_cluster_ships_a_driver_only_processor_and_delivers_exact_results(
        db_url, tmp_path, standalone_cluster):
    module_dir = tmp_path / "driver_only"
    module_dir.mkdir()
    (module_dir / "cluster_region_totals.py").write_text(PROCESSOR_MODULE)
    payloads = order_payloads(200, customers=6)
    enqueue_orders(db_url, payloads)
    env = spark_env(db_url, PYTHONPATH=str(module_dir), SPARK_LOCAL_IP="127.0.0.1",
                    OUTBOXQ_SPARK_CONF=json.dumps({"spark.executor.memory": "512m", "spark.cores.max": "1"}))
    env.pop("PYSPARK_PYTHON", None)  # the consumer sets it: the executors run the driver's interpreter
    command = spark_run_command("--master", standalone_cluster, "--batch-size", "100", "--until-empty",
                                processor="cluster_region_totals:region_totals", output_table="region_totals")

    started = time.monotonic()
    run = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    elapsed = time.monotonic() - started

    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout)
    assert result["jobs_completed"] == 200 and result["batches"] == 2, result
    expected: dict[str, list] = {}
    for p in payloads:
        entry = expected.setdefault("even" if int(p["customer"][1:]) % 2 == 0 else "odd", [0, Decimal("0")])
        entry[0] += 1
        entry[1] += Decimal(str(p["amount"]))
    got: dict[str, list] = {}
    for region, orders, total, _ in table_rows(db_url, "region_totals"):
        entry = got.setdefault(region, [0, Decimal("0")])
        entry[0] += orders
        entry[1] += total
    assert got == expected
    assert statuses(db_url) == {"done": 200}
    print(f"cluster run: {elapsed:.1f} s (session start {result['session_start_s']} s)")


def test_a_streaming_query_through_format_outboxq_runs_on_a_standalone_cluster(db_url, tmp_path, standalone_cluster):
    """The data source's reads and the sink's writes run on the cluster's executor, each job written once."""
    payloads = order_payloads(300)
    enqueue_orders(db_url, payloads, queue="cluster-orders")
    env = spark_env(db_url, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=os.getcwd(),
                    OUTBOXQ_SPARK_CONF=json.dumps({"spark.executor.memory": "512m", "spark.cores.max": "1"}))
    env.pop("PYSPARK_PYTHON", None)
    command = [sys.executable, "-m", "tests.spark_stream_driver", db_url, str(tmp_path / "checkpoint"),
               "--queue", "cluster-orders", "--table", "cluster_totals", "--master", standalone_cluster,
               "--max-jobs", "100", "--available-now"]
    run = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)

    assert run.returncode == 0, run.stderr[-4000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"batches": 3, "rows": 300}
    assert statuses(db_url, "cluster-orders") == {"done": 300}
    rows = table_rows(db_url, "cluster_totals")
    assert len({row[0] for row in rows}) == len(rows) == 300
    assert sum(row[2] for row in rows) == sum(Decimal(str(p["amount"])) for p in payloads)  # (job_id, customer, amount, hash)
