"""The benchmark and chaos harness (tools/, `python -m tools`) stays apart from the product: no module of
outboxq imports it, and a user's worker serves its own consumers' queues only (no chaos-* queue), even where
the harness is importable (the repository's root on PYTHONPATH)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import stop_processes, wait_for

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("app", "workers", "spark_jobs", "migrations")  # the folders the outboxq package is built from
HARNESS = re.compile(r"(outboxq\.)?tools(\.\w+)*")  # the harness or one of its modules, as an import names it
STARTED = re.compile(r"worker \S+ started: queues (.*?), concurrency \d+, batch \d+")


def _harness_imports(path: Path) -> list[str]:
    """Where the file imports the harness (`tools`, `outboxq.tools`), or names one of its modules in a string
    (a handler module, an importlib name): "line: what"."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # (`from outboxq import tools` names the package in its alias)
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # a dotted module name in a string ("tools.chaos_handlers"); the bare word "tools" in prose is not one
            names = [word.rstrip(".") for word in re.split(r"[\s,:;'\"`()]+", node.value) if "." in word]
        else:
            continue
        hits = [name for name in names if HARNESS.fullmatch(name)]
        if hits:
            found.append(f"{node.lineno}: {hits[0]}")
    return sorted(found)


def test_the_check_finds_every_way_a_module_names_the_harness(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import itertools\n"
                      "from outboxq.tools import bench\n"
                      "from outboxq import tools\n"
                      "import tools.chaos\n"
                      "def f():\n"
                      "    from tools.chaos_more import run_more\n"
                      "    return ['--handlers', 'tools.chaos_handlers', 'the tools folder']\n")
    assert _harness_imports(sample) == ["2: outboxq.tools", "3: outboxq.tools", "4: tools.chaos",
                                        "6: tools.chaos_more", "7: tools.chaos_handlers"]


def test_no_module_of_the_product_imports_the_harness():
    sources = [p for folder in PRODUCT for p in sorted((ROOT / folder).rglob("*.py"))]
    assert len(sources) > 50  # the walk found the product
    offenders = {str(p.relative_to(ROOT)): hits for p in sources if (hits := _harness_imports(p))}
    assert offenders == {}


def test_the_outboxq_command_loads_without_the_harness_even_where_it_is_importable():
    # cwd and PYTHONPATH at the repository's root: `tools` is importable, so only an import would load it.
    check = ("import sys\n"
             "from outboxq.cli import build_parser\n"
             "import outboxq, outboxq.api, outboxq.workers.runner, outboxq.spark_jobs.consumer\n"
             "build_parser()\n"
             "import importlib.util; assert importlib.util.find_spec('tools') is not None\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'tools' or m.startswith('outboxq.tools')))\n")
    done = subprocess.run([sys.executable, "-c", check], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("subcommand", [["bench", "drain"], ["chaos"], ["spark", "bench"]])
def test_the_outboxq_command_has_no_bench_or_chaos(subcommand, capsys):
    from outboxq.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(subcommand)
    capsys.readouterr()


def test_a_users_worker_serves_only_its_own_modules_queues(db_url, tmp_path):
    import tests.handlers_basic as module
    from outboxq.workers.registry import all_consumers

    own = sorted(c.queue for c in all_consumers() if c.handler.__module__ == module.__name__)
    assert own == ["count", "slow"]
    log_path = tmp_path / "worker.log"
    env = {**os.environ, "DATABASE_URL": db_url, "PYTHONPATH": str(ROOT)}
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "outboxq.cli", "--log-level", "INFO", "worker", "--processes", "1",
             "--handlers", module.__name__, "--poll-interval", "0.2"],
            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        listed = wait_for(lambda: next((m.group(1) for m in map(STARTED.search, log_path.read_text().splitlines())
                                        if m), None) or worker.poll() is not None, timeout=90)
        assert isinstance(listed, str), log_path.read_text()[-4000:]
    finally:
        stop_processes(worker)
    queues = listed.split(", ")
    assert sorted(queues) == own, listed
    assert not [q for q in queues if q.startswith("chaos")]
