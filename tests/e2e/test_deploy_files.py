"""docker-compose.yml and the Dockerfile stay consistent with the code (no Docker engine runs here)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from outboxq.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def cli_commands() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return set(sub.choices)


def test_compose_file_parses_and_every_service_command_exists_in_the_cli():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "migrate", "shop-migrate", "api", "worker"} <= set(services)
    commands = cli_commands()
    for name, service in services.items():
        if name == "postgres":
            continue
        if "entrypoint" in service:  # the example shop's own programs, run from its folder
            assert service["working_dir"] == "/home/outboxq/shop"
            module = service["entrypoint"][2]
            assert module in ("alembic", "uvicorn"), f"service {name} runs {module}"
            if module == "uvicorn":
                assert (ROOT / "examples" / "shop" / "app" / "main.py").exists()
            continue
        assert service["command"][0] in commands, f"service {name} runs an unknown command"
    assert services["worker"]["command"] == ["worker", "--handlers", "app.handlers"]
    assert (ROOT / "examples" / "shop" / "app" / "handlers.py").exists()
    assert services["api"]["depends_on"]["shop-migrate"]["condition"] == "service_completed_successfully"
    # No default admin token: compose refuses to start until OUTBOXQ_API_TOKENS is set.
    assert services["migrate"]["environment"]["OUTBOXQ_API_TOKENS"].startswith("${OUTBOXQ_API_TOKENS:?")


def test_dockerfile_copies_only_what_exists_and_runs_as_a_non_root_user():
    dockerfile = (ROOT / "Dockerfile").read_text()
    for source in re.findall(r"^COPY (?!--from)(?:--chown=\S+ )?(\S+)", dockerfile, flags=re.M):
        assert (ROOT / source).exists(), f"Dockerfile copies missing {source}"
    assert "USER outboxq" in dockerfile
    assert 'ENTRYPOINT ["outboxq"]' in dockerfile
