"""Another revision of outboxq drained beside this checkout's, in the same rounds (`bench drain --variant
NAME=REV`): a change measured against its base in alternation, drain after drain, so that the machine's drift
between two runs minutes apart (on a shared 2-core machine, as large as the change) cancels out round by round.

The revision is exported from git (`git archive`) into a scratch folder and imported from there by its drivers,
ahead of the installed package; the harness (tools/) stays this checkout's. Both must share the database schema:
the drains of both run in databases cloned from one template, migrated by this checkout.
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import tarfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")


@dataclass(frozen=True)
class Variant:
    """A revision to drain beside the checkout: its name in the tables, its git revision, and the folder whose
    `outboxq` package is that revision's (put first on its drivers' PYTHONPATH)."""

    name: str
    rev: str
    import_root: Path


def parse_variant(text: str) -> tuple[str, str]:
    """NAME=REV (`base=HEAD`, `before=HEAD~2`): a short lowercase name for the tables, and a git revision."""
    name, _, rev = text.partition("=")
    if not _NAME.fullmatch(name) or not rev:
        raise argparse.ArgumentTypeError(
            f"a variant is NAME=REV, NAME in lowercase letters, digits and _ (up to 32), REV a git revision; "
            f"not {text!r}")
    return name, rev


def prepare(name: str, rev: str, into: Path, repo: Path = ROOT) -> Variant:
    """Export `rev` of `repo` into `into` and lay its packages out as the installed `outboxq` is (pyproject's
    package-dir: app/ is `outboxq`, workers/ its `outboxq.workers`, and so on). ValueError when the revision
    is unknown, or its migrations are not this checkout's (the two would need databases of their own)."""
    exported = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", rev], capture_output=True)
    if exported.returncode != 0:
        raise ValueError(f"variant {name}: git cannot export {rev!r}: {exported.stderr.decode().strip()}")
    changed = subprocess.run(["git", "-C", str(repo), "diff", "--quiet", rev, "--", "migrations"])
    if changed.returncode != 0:
        raise ValueError(f"variant {name}: the migrations of {rev!r} differ from this checkout's; a variant must "
                         "share the database schema")
    tree = into / name
    tree.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(exported.stdout)) as archive:
        archive.extractall(tree, filter="data")
    package_dirs = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    top = tree / package_dirs["outboxq"]
    for package, folder in package_dirs.items():
        if package != "outboxq":  # outboxq.workers -> workers/, linked in as the top package's subfolder
            link = top.joinpath(*package.split(".")[1:])
            if not link.exists():
                link.symlink_to(tree / folder, target_is_directory=True)
    import_root = into / f"{name}-import"
    import_root.mkdir()
    (import_root / "outboxq").symlink_to(top, target_is_directory=True)
    return Variant(name, rev, import_root)
