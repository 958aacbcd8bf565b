"""The SparkSession of a consumer, built from settings: local[*] by default, any master URL unchanged."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from outboxq.settings import Settings, get_settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def is_local_master(master: str) -> bool:
    """True for the in-process masters (local, local[N], local[*], local[N,F])."""
    return master == "local" or master.startswith("local[")


def session_config(
    master: str | None = None,
    *,
    settings: Settings | None = None,
    shuffle_partitions: int | None = None,
    extra_conf: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The Spark configuration a consumer runs with (what spark-submit --conf would carry)."""
    settings = settings or get_settings()
    conf = {
        "spark.master": master or settings.spark_master,
        "spark.app.name": settings.spark_app_name,
        "spark.sql.shuffle.partitions": str(shuffle_partitions or settings.spark_shuffle_partitions),
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
    }
    if is_local_master(conf["spark.master"]):
        # One machine: no UI port to bind, the driver on the loopback address.
        conf["spark.ui.enabled"] = "false"
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
    conf.update(settings.spark_conf)
    conf.update(extra_conf or {})
    return conf


def build_session(
    master: str | None = None,
    *,
    settings: Settings | None = None,
    shuffle_partitions: int | None = None,
    extra_conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A SparkSession for a long-lived consumer (start it once: it takes seconds, not milliseconds)."""
    conf = session_config(master, settings=settings, shuffle_partitions=shuffle_partitions, extra_conf=extra_conf)
    # Python workers run the same interpreter as the driver (the one with outboxq installed).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if is_local_master(conf["spark.master"]):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    # py4j logs every connection it opens and closes at INFO, even at interpreter exit (to closed streams).
    logging.getLogger("py4j").setLevel(logging.WARNING)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("OUTBOXQ_SPARK_LOG_LEVEL", "WARN"))
    return spark


def ship_to_executors(spark: SparkSession, function: Callable[..., Any]) -> str | None:
    """Send the processor's own code to the executors (addPyFile); the path shipped, or None.

    On a cluster the executors import the module of every Python function they run (a UDF of the
    processor's module), and they do not have the driver's import path. A top-level module goes as its
    file, a module of a package as a zip of its top-level package. Installed packages (site-packages) and
    outboxq itself are not shipped: they belong to the executors' Python environment.
    """
    if is_local_master(spark.sparkContext.master or "local"):  # (pyspark types master as optional; it is set)
        return None  # the executors are this process's threads: they import what the driver imports
    top = function.__module__.partition(".")[0]
    module = sys.modules.get(top)
    file = getattr(module, "__file__", None)
    if top in ("outboxq", "__main__") or not file:
        return None
    path = Path(file).resolve()
    if {"site-packages", "dist-packages"} & set(path.parts):
        return None
    if path.name == "__init__.py":
        archive = Path(tempfile.mkdtemp(prefix="outboxq-py-files-")) / f"{top}.zip"
        with zipfile.ZipFile(archive, "w") as zipped:
            for source in sorted(path.parent.rglob("*.py")):
                zipped.write(source, Path(top) / source.relative_to(path.parent))
        path = archive
    spark.sparkContext.addPyFile(str(path))
    logging.getLogger("outboxq.spark").info("spark: shipped %s to the executors", path)
    return str(path)
