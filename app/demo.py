"""`outboxq demo`: run the example shop (examples/shop) on the configured or embedded PostgreSQL.

The shop is an application that embeds outboxq, with its own `app` package; it is not installed with
outboxq, so the demo finds it in the checkout and runs its demo (`python -m app.demo`) from its folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from outboxq.errors import InvalidInput


def find_example(example_dir: str | None = None) -> Path:
    """The shop's folder: `example_dir`, else ./examples/shop, else the one beside this checkout's package."""
    candidates = [Path(example_dir)] if example_dir else [
        Path.cwd() / "examples" / "shop",
        Path(__file__).resolve().parents[1] / "examples" / "shop",  # an editable install of a checkout
    ]
    for candidate in candidates:
        if (candidate / "app" / "demo.py").is_file():
            return candidate.resolve()
    raise InvalidInput(
        "the example shop was not found (looked in " + ", ".join(str(c) for c in candidates) + "); run "
        "`outboxq demo` from a checkout of outboxq, or pass --example-dir PATH/TO/examples/shop"
    )


def run_demo(url: str, *, orders: int = 300, example_dir: str | None = None) -> int:
    """Run the shop's demo against `url` (outboxq already migrated); returns its exit code."""
    shop = find_example(example_dir)
    env = {**os.environ, "DATABASE_URL": url}
    return subprocess.run([sys.executable, "-m", "app.demo", "--orders", str(orders)], cwd=shop, env=env).returncode
