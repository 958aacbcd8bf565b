"""A class-data-sharing archive of the classes a Spark driver loads, for the suite's JVMs (a test helper only).

A local Spark session spends most of its start-up loading and verifying some ten thousand classes from Spark's
jars; a JVM started with `-XX:SharedArchiveFile` maps them from an archive instead, for about half the CPU of a
session's start-up. tests/conftest.py runs this module once per machine in the background, at the start of
a run whose archive is missing, and points every JVM of the suite at the archive through JAVA_TOOL_OPTIONS. A
JVM whose class path does not begin with the archive's, or that starts before the archive exists, runs as it
would without it; the archive is written to a temporary name and renamed, so no JVM ever sees half of one.

    python -m tests.jvm_class_archive PATH
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

# The options of every JVM of the suite: the C1 compiler alone (they live for seconds), the serial collector,
# and no CDS log lines (a JVM that cannot use the archive says so on stdout, where spark-class reads the
# launcher's answer).
BASE_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xlog:cds=off,cds+dynamic=off"


def archive_path() -> Path:
    """Where this machine's archive lives: named after PySpark's version, the java binary and the options, so
    that another Spark or Java makes (and uses) another archive."""
    import shutil
    from importlib.metadata import version

    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else \
        shutil.which("java") or "java"
    java = os.path.realpath(java)
    stamp = os.stat(java).st_mtime_ns if os.path.exists(java) else 0
    key = hashlib.sha256(f"{version('pyspark')}|{java}|{stamp}|{BASE_JAVA_OPTIONS}".encode()).hexdigest()[:16]
    return Path(os.path.expanduser("~/.cache/outboxq-tests")) / f"spark-classes-{key}.jsa"


def make_archive(path: Path) -> None:
    """Run a small local Spark session whose JVM dumps the classes it loaded to `path` when it exits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    os.environ["JAVA_TOOL_OPTIONS"] = f"{BASE_JAVA_OPTIONS} -XX:ArchiveClassesAtExit={partial}"

    from outboxq.spark_jobs.session import build_session

    session = build_session("local[2]", shuffle_partitions=2)
    # What the suite's drivers do most: rows from Python and from JSON, a join, an aggregate, a Python UDF.
    rows = session.createDataFrame([(i, f'{{"amount": {i}}}') for i in range(100)], "id long, payload string")
    parsed = rows.selectExpr("id", "from_json(payload, 'amount long') AS p").selectExpr("id", "p.amount")
    parsed.join(rows, "id").groupBy((parsed.id % 3).alias("k")).sum("amount").collect()
    session.udf.register("twice", lambda x: x * 2, "long")
    rows.selectExpr("twice(id)").collect()
    gateway = session.sparkContext._gateway
    process = gateway.proc  # the JVM (spark-submit execs it): it writes the archive as it exits
    session.stop()
    gateway.shutdown()
    process.stdin.close()
    process.wait(timeout=120)
    if partial.exists() and partial.stat().st_size > 0:
        os.replace(partial, path)
    else:
        partial.unlink(missing_ok=True)


def start_making_archive(path: Path) -> None:
    """Make the archive in a process of its own that outlives the test run (the runs after this one use it)."""
    import subprocess

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f"{path.name}.log"), "w") as log:
        subprocess.Popen([sys.executable, "-m", "tests.jvm_class_archive", str(path)], stdout=log,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                         cwd=Path(__file__).resolve().parents[1])


if __name__ == "__main__":
    make_archive(Path(sys.argv[1]))
