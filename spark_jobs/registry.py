"""The registry of Spark processors: the names an operator made available, each bound to a function.

Names come from ``OUTBOXQ_SPARK_PROCESSORS`` (``name=module:function,...``) and from installed packages'
``outboxq.spark_processors`` entry points (the setting wins on a clash). An HTTP request names a processor
only this way: code to import is the operator's choice, never the request's. The CLI, run by the operator,
also takes a ``module:function`` path.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from outboxq.errors import InvalidInput
from outboxq.settings import Settings, get_settings

ENTRY_POINT_GROUP = "outboxq.spark_processors"


def registered_processors(settings: Settings | None = None) -> dict[str, str]:
    """Every registered processor: name -> "module:function"."""
    settings = settings or get_settings()
    registry = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    registry.update(settings.spark_processors)
    return registry


def registered_spec(name: str, settings: Settings | None = None) -> str:
    """The "module:function" registered under ``name``, or InvalidInput listing the registered names."""
    registry = registered_processors(settings)
    spec = registry.get(name) if isinstance(name, str) else None
    if spec is None:
        names = ", ".join(sorted(registry)) or "none (set OUTBOXQ_SPARK_PROCESSORS=name=module:function)"
        raise InvalidInput(f"unknown processor {name!r}: registered processors are {names}")
    return spec


def load(name_or_path: str, *, allow_path: bool, settings: Settings | None = None) -> Callable[..., Any]:
    """The processor function: a registered name, or (with allow_path, for the operator's CLI) a path."""
    from outboxq.spark_jobs.processing import load_processor

    registry = registered_processors(settings)
    if name_or_path in registry:
        return load_processor(registry[name_or_path])
    if not allow_path:
        registered_spec(name_or_path, settings)  # raises, listing the names
    return load_processor(name_or_path)
