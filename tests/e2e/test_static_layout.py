"""The development install is a layout static tools can read: pyright resolves `outboxq.*` imports to the
repository's own files (what an editor's go-to-definition follows) and reports a wrong one. That every import
of the project resolves is checked by scripts/typecheck, which CI runs before the suite (the same pyright run
here would cost the suite half a minute and tell nothing new)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pyright(*args: str, cwd: Path) -> dict:
    checker = shutil.which("basedpyright", path=str(Path(sys.executable).parent))
    assert checker, "basedpyright comes with the dev extra"
    done = subprocess.run([checker, "--pythonpath", sys.executable, "--outputjson", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    return json.loads(done.stdout)


def test_a_wrong_outboxq_import_is_reported_and_the_right_ones_lead_to_the_repositorys_files(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from outboxq.queue.enqueue import enqueue\n"
                     "from outboxq.workers.dispatcher import Dispatcher\n"
                     "from outboxq.nowhere import thing\n"
                     "print(enqueue, Dispatcher, thing)\n")
    report = _pyright(str(probe), cwd=tmp_path)
    missing = [d["message"] for d in report["generalDiagnostics"] if d.get("rule") == "reportMissingImports"]
    assert missing == ['Import "outboxq.nowhere" could not be resolved'], missing
    # The installed names are links into the checkout: following one lands in the repository's file.
    import outboxq.queue.enqueue
    import outboxq.workers.dispatcher

    assert Path(outboxq.queue.enqueue.__file__).resolve() == ROOT / "app" / "queue" / "enqueue.py"
    assert Path(outboxq.workers.dispatcher.__file__).resolve() == ROOT / "workers" / "dispatcher.py"
