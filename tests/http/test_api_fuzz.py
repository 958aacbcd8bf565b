"""Property-based fuzz of the OpenAPI document: generated requests never get a 5xx or a response off-schema.

An equivalent of schemathesis without the dependency: strategies are built from each operation's parameter
and body schemas (valid values, near misses and arbitrary JSON), responses are checked against the
document's declared statuses and schemas.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outboxq.api import create_app
from tests.api_support import api_client, api_settings

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec="utf-8"), max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


class SchemaStrategies:
    """Hypothesis strategies for the JSON Schema subset FastAPI emits."""

    def __init__(self, document: dict[str, Any]):
        self.components = document.get("components", {}).get("schemas", {})

    def resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in schema:
            schema = self.components[schema["$ref"].rsplit("/", 1)[1]]
        return schema

    def valid(self, schema: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
        schema = self.resolve(schema)
        if "anyOf" in schema:
            return st.one_of([self.valid(s, depth) for s in schema["anyOf"]])
        if "enum" in schema:
            return st.sampled_from(schema["enum"])
        kind = schema.get("type")
        if kind == "object" or "properties" in schema:
            props = schema.get("properties", {})
            required = set(schema.get("required", []))
            if depth > 3:
                return st.just({})
            return st.fixed_dictionaries(
                {k: self.valid(v, depth + 1) for k, v in props.items() if k in required},
                optional={k: self.valid(v, depth + 1) for k, v in props.items() if k not in required},
            )
        if kind == "array":
            return st.lists(self.valid(schema.get("items", {}), depth + 1), max_size=3)
        if kind == "string":
            if "pattern" in schema:
                return st.from_regex(schema["pattern"], fullmatch=True)
            return st.text(st.characters(codec="utf-8"), min_size=schema.get("minLength", 0), max_size=30)
        if kind == "integer":
            return st.integers(min_value=schema.get("minimum"), max_value=schema.get("maximum"))
        if kind == "number":
            return st.floats(min_value=schema.get("minimum"), max_value=schema.get("maximum"),
                             allow_nan=False, allow_infinity=False)
        if kind == "boolean":
            return st.booleans()
        if kind == "null":
            return st.none()
        return json_values

    def fuzzed(self, schema: dict[str, Any]) -> st.SearchStrategy[Any]:
        """Mostly valid values, sometimes anything at all."""
        return st.one_of(self.valid(schema), self.valid(schema), json_values)


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method.upper(), path, op) for path, item in document["paths"].items()
            for method, op in item.items()]


def _check_schema(strategies: SchemaStrategies, schema: dict[str, Any], value: Any, where: str) -> None:
    """A small validator of responses against the declared schema (types, required fields)."""
    schema = strategies.resolve(schema)
    if "anyOf" in schema:
        errors = []
        for option in schema["anyOf"]:
            try:
                _check_schema(strategies, option, value, where)
                return
            except AssertionError as exc:
                errors.append(str(exc))
        raise AssertionError(f"{where}: matches no anyOf option: {errors}")
    kind = schema.get("type")
    types = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
             "integer": int, "number": (int, float)}
    if kind in types:
        assert isinstance(value, types[kind]), f"{where}: {value!r} is not {kind}"
    if kind == "object" or "properties" in schema:
        for name in schema.get("required", []):
            assert name in value, f"{where}: missing {name}"
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                _check_schema(strategies, sub, value[name], f"{where}.{name}")
    if kind == "array":
        for i, item in enumerate(value):
            _check_schema(strategies, schema.get("items", {}), item, f"{where}[{i}]")


def test_fuzzed_requests_never_get_a_5xx_or_an_undocumented_response(db_url):
    document = create_app(api_settings(db_url)).openapi()
    strategies = SchemaStrategies(document)
    operations = _operations(document)
    assert len(operations) >= 19
    seen_statuses: set[int] = set()

    with api_client(db_url, raise_server_exceptions=False, max_payload_bytes=4096) as client:

        @settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
        @given(st.data())
        def run(data: st.DataObject) -> None:
            method, path, op = data.draw(st.sampled_from(operations), label="operation")
            url, query, headers = path, {}, {}
            for param in op.get("parameters", []):
                value = data.draw(strategies.fuzzed(param["schema"]), label=param["name"])
                if param["in"] == "path":
                    # "." and ".." are dot segments that clients remove from a URL: not a queue name in a path
                    text = str(value) if str(value) not in ("", ".", "..") else "_"
                    text = quote(re.sub(r"[/?#%]", "_", text), safe="")
                    url = url.replace("{" + param["name"] + "}", text)
                elif param["in"] == "query" and (param.get("required") or data.draw(st.booleans())):
                    if isinstance(value, str | int | float | bool):
                        query[param["name"]] = value
                elif param["in"] == "header" and data.draw(st.booleans()):
                    headers[param["name"]] = re.sub(r"[^\x20-\x7e]", "x", str(value))[:300] or "x"
            kwargs: dict[str, Any] = {"params": query, "headers": headers}
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body is not None:
                kwargs["json"] = data.draw(strategies.fuzzed(body["schema"]), label="body")
            response = client.request(method, url, **kwargs)
            seen_statuses.add(response.status_code)
            assert response.status_code < 500 or (response.status_code == 503 and "spark" in path), (
                method, url, kwargs, response.text)
            declared = op["responses"].get(str(response.status_code))
            assert declared is not None, (method, path, response.status_code, response.text)
            content = declared.get("content", {}).get("application/json")
            if content is not None and response.headers["content-type"].startswith("application/json"):
                _check_schema(strategies, content["schema"], response.json(), f"{method} {path}")

        run()
    assert {200, 201, 422} <= seen_statuses
