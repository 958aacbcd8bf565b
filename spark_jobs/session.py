"""The SparkSession of a consumer, built from settings: local[*] by default, any master URL unchanged."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

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
