"""Tool declarations: valid Draft 2020-12 schemas that together use every feature we promise."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from dsv4bench.agents import FAMILIES

ALL_TOOLS = [(f.name, t) for f in FAMILIES.values() for t in f.tools]


def walk(schema: Any, depth: int = 0) -> Iterator[tuple[dict[str, Any], int]]:
    """Every subschema with its object-nesting depth (the top-level arguments object is depth 0)."""
    if not isinstance(schema, dict):
        return
    yield schema, depth
    inner = depth + (1 if schema.get("type") == "object" else 0)
    for sub in (schema.get("properties") or {}).values():
        yield from walk(sub, inner)
    if "items" in schema:
        yield from walk(schema["items"], inner)


def types_of(schema: dict[str, Any]) -> set[str]:
    t = schema.get("type")
    return set(t) if isinstance(t, list) else {t} if t else set()


def test_enough_tools_with_unique_names() -> None:
    assert len(ALL_TOOLS) >= 12
    for fam in FAMILIES.values():
        names = [t.name for t in fam.tools]
        assert len(names) == len(set(names)) >= 5, fam.name
        assert set(fam.tool_schemas()) == set(names)


@pytest.mark.parametrize("family,tool", ALL_TOOLS, ids=[f"{f}.{t.name}" for f, t in ALL_TOOLS])
def test_schema_is_valid_draft_2020_12(family: str, tool: Any) -> None:
    Draft202012Validator.check_schema(tool.parameters)
    assert tool.parameters["type"] == "object"
    assert tool.description
    entry = tool.openai()
    assert entry["type"] == "function" and entry["function"]["name"] == tool.name


@pytest.mark.parametrize("family,tool", ALL_TOOLS, ids=[f"{f}.{t.name}" for f, t in ALL_TOOLS])
def test_every_object_rejects_unknown_keys(family: str, tool: Any) -> None:
    for sub, _ in walk(tool.parameters):
        if "object" in types_of(sub):
            assert sub.get("additionalProperties") is False, (tool.name, sub)
            assert set(sub.get("required", [])) <= set(sub.get("properties", {})), tool.name


def test_schemas_cover_every_feature() -> None:
    seen_types: set[str] = set()
    has = {"enum": False, "nested_object": False, "object_in_array": False, "required": False, "optional": False}
    for _, tool in ALL_TOOLS:
        for sub, depth in walk(tool.parameters):
            seen_types |= types_of(sub)
            has["enum"] |= "enum" in sub
            if "object" in types_of(sub):
                has["nested_object"] |= depth >= 1
                props, req = set(sub.get("properties", {})), set(sub.get("required", []))
                has["required"] |= bool(req)
                has["optional"] |= bool(props - req)
            if "array" in types_of(sub):
                has["object_in_array"] |= "object" in types_of(sub.get("items", {}))
    assert {"string", "integer", "number", "boolean", "array", "object"} <= seen_types
    assert all(has.values()), has


def test_system_prompts_and_descriptions() -> None:
    for fam in FAMILIES.values():
        assert fam.name and fam.description and len(fam.system_prompt) > 100


def test_schemas_match_the_tool_methods() -> None:
    """Every declared property is a parameter of the tool's method; required ones have no default."""
    for fam in FAMILIES.values():
        world = fam.build_world(0)
        for tool in fam.tools:
            params = inspect.signature(getattr(world, f"tool_{tool.name}")).parameters
            assert set(params) == set(tool.parameters["properties"]), tool.name
            required = {n for n, p in params.items() if p.default is inspect.Parameter.empty}
            assert required == set(tool.parameters["required"]), tool.name
