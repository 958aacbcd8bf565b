"""docker-compose.yml and the Dockerfile stay consistent with the code (no Docker engine runs here)."""

from __future__ import annotations

import re
import shlex
from argparse import Namespace
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from outboxq.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def cli_commands() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return set(sub.choices)


def compose_services() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def migrate_steps(services: dict) -> list[Namespace]:
    """The `outboxq` commands the migrate service runs (one shell line of commands joined by &&), parsed by the
    CLI's own parser: an option it does not know fails here."""
    service = services["migrate"]
    assert service["entrypoint"] == ["/bin/sh", "-euc"]
    [script] = service["command"]
    steps = []
    for command in script.split("&&"):
        program, *argv = shlex.split(command)
        assert program == "outboxq", command
        steps.append(build_parser().parse_args(argv))
    return steps


def test_compose_file_parses_and_every_service_command_exists_in_the_cli():
    services = compose_services()
    assert {"postgres", "migrate", "shop-migrate", "shop-grants", "api", "worker"} <= set(services)
    commands = cli_commands()
    assert [step.command for step in migrate_steps(services)][0] == "migrate"
    for name, service in services.items():
        if name == "postgres" or name == "migrate":
            continue
        if service.get("image", "").startswith("postgres:"):  # psql, from the postgres image
            assert service["entrypoint"][0] == "psql"
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
    for name in ("api", "worker"):  # after the shop's tables exist and are granted to their roles
        assert services[name]["depends_on"]["shop-grants"]["condition"] == "service_completed_successfully"
    assert services["shop-grants"]["depends_on"]["shop-migrate"]["condition"] == "service_completed_successfully"
    assert services["shop-migrate"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    # No default admin token: compose refuses to start until OUTBOXQ_API_TOKENS is set.
    assert services["api"]["environment"]["OUTBOXQ_API_TOKENS"].startswith("${OUTBOXQ_API_TOKENS:?")


def test_compose_runs_the_long_running_services_as_the_roles_migrate_creates_not_the_superuser():
    services = compose_services()
    superuser = services["postgres"]["environment"]["POSTGRES_USER"]
    superuser_password = services["postgres"]["environment"]["POSTGRES_PASSWORD"]
    roles = {step.role: step for step in migrate_steps(services) if step.command == "create-role"}
    assert urlsplit(services["migrate"]["environment"]["DATABASE_URL"]).username == superuser
    for name, component in (("api", "api"), ("worker", "worker"), ("spark", "spark")):
        environment = services[name]["environment"]
        url = urlsplit(environment["DATABASE_URL"])
        assert url.username in roles and url.username not in (superuser, "postgres"), name
        role = roles[url.username]
        assert role.component == component
        # The same password create-role set, from the same variable; no password written into the URL.
        assert url.password is None
        assert environment["PGPASSWORD"].startswith("${" + role.password_env + ":?")
        assert services["migrate"]["environment"][role.password_env].startswith("${" + role.password_env + ":?")
        assert superuser_password not in environment.values(), f"{name} holds the superuser's password"
    for role in roles.values():
        # Passwords never on the command line; a restart brings the roles up to date; a server of its own.
        assert role.password_env and role.password_file is None
        assert role.update_existing and role.lock_down_public
    grants = services["shop-grants"]["command"][0]
    assert "TO outboxq_api" in grants and "TO outboxq_worker" in grants


def test_dockerfile_copies_only_what_exists_and_runs_as_a_non_root_user():
    dockerfile = (ROOT / "Dockerfile").read_text()
    for source in re.findall(r"^COPY (?!--from)(?:--chown=\S+ )?(\S+)", dockerfile, flags=re.M):
        assert (ROOT / source).exists(), f"Dockerfile copies missing {source}"
    assert "USER outboxq" in dockerfile
    assert 'ENTRYPOINT ["outboxq"]' in dockerfile
