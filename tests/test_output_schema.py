"""Tool output schemas are published without $ref, optional fields as type lists, and accept exactly what pydantic's form accepts."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from jsonschema import validators
from mcp import Client
from pydantic import TypeAdapter

from retrieval.models import KnowledgeMap, LookupResult, ReadResult, ResetResult
from server.protocol.output_schema import inline_definitions, merge_nullable, published

_DOCUMENT = {
    "doc_key": "ops/kafka.md",
    "title": "Kafka",
    "domain": "ops",
    "content": "Kafka › Lag\nRestart the consumer.",
    "sections": ["Lag"],
    "section_count": 3,
    "partial": True,
}
_BUDGET = {"calls_used": 2, "water_level": "HIGH", "next_call": "STOP", "guidance": "answer now"}
_DEDUPED = {
    "found": False,
    "relevance_level": "DEDUPED",
    "completeness_hint": "you already hold it",
    "primary": None,
    "supplement": [],
    "retrieved_domains_this_session": ["ops"],
    "dedup_reason": "doc_retrieved",
    "already_in_context": [{"doc_key": "ops/kafka.md", "title": "Kafka", "sections": ["Lag"]}],
    "session_scope": "explicit",
    "message": "",
    "budget": _BUDGET,
}
_FOUND = {**_DEDUPED, "found": True, "relevance_level": "PRECISE", "dedup_reason": None, "primary": _DOCUMENT}


def _set(document: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    node = changed
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return changed


_DELETE = object()

# Valid results, then one change each inside a definition the original schema reaches by $ref.
_CASES = [
    _DEDUPED,
    _FOUND,
    {**_FOUND, "supplement": [_DOCUMENT, _DOCUMENT]},
    _set(_FOUND, ("budget", "water_level"), None),
    _set(_FOUND, ("budget", "next_call"), None),
    _set(_FOUND, ("relevance_level",), "GREAT"),
    _set(_FOUND, ("budget", "water_level"), "FULL"),
    _set(_FOUND, ("budget", "next_call"), 3),
    _set(_FOUND, ("budget", "guidance"), _DELETE),
    _set(_FOUND, ("primary", "content"), _DELETE),
    _set(_FOUND, ("primary", "section_count"), "three"),
    _set(_FOUND, ("primary",), "ops/kafka.md"),
    _set(_FOUND, ("already_in_context", 0, "title"), None),
    _set(_FOUND, ("dedup_reason",), "other"),
    {**_FOUND, "supplement": [{"doc_key": "x"}]},
    _set(_FOUND, ("primary",), 3),
    _set(_FOUND, ("primary",), []),
    _set(_FOUND, ("dedup_reason",), 7),
    _set(_FOUND, ("budget", "water_level"), ""),
]
_VALID = 5  # the first cases are valid, every later one invalid


def _verdicts(schema: dict[str, Any]) -> list[list[str]]:
    validator = validators.validator_for(schema)(schema)
    return [sorted(error.message for error in validator.iter_errors(case)) for case in _CASES]


def test_the_lookup_schema_accepts_and_rejects_the_same_documents_inlined() -> None:
    original = TypeAdapter(LookupResult).json_schema()
    assert "$defs" in original  # the case this module exists for
    inlined = inline_definitions(original)
    assert "$ref" not in json.dumps(inlined) and "$defs" not in inlined
    verdicts, inlined_verdicts = _verdicts(original), _verdicts(inlined)
    assert verdicts[:_VALID] == [[]] * _VALID
    assert all(verdicts[_VALID:]), "each changed case must be invalid"
    assert inlined_verdicts == verdicts


def test_the_published_lookup_schema_has_no_nullable_alternatives_and_the_same_verdicts() -> None:
    original = TypeAdapter(LookupResult).json_schema()
    assert '"anyOf"' in json.dumps(inline_definitions(original))  # the case merge_nullable exists for
    listed = published(original)
    assert '"anyOf"' not in json.dumps(listed) and "$ref" not in json.dumps(listed)
    # Messages differ ("is not valid under any of the given schemas" becomes a type error); which
    # documents pass does not.
    assert [not v for v in _verdicts(listed)] == [not v for v in _verdicts(original)]
    assert listed["properties"]["dedup_reason"]["enum"][-1] is None


def _accepts(schema: dict[str, Any], instance: Any) -> bool:
    return validators.validator_for(schema)(schema).is_valid(instance)


@pytest.mark.parametrize(
    ("branch", "instances"),
    [
        ({"type": "string", "enum": ["A"]}, ["A", None, "B", 1]),
        ({"type": "integer", "minimum": 3}, [3, 2, None, "3"]),
        ({"type": "object", "required": ["a"]}, [{"a": 1}, {}, None, []]),
    ],
)
def test_a_merged_optional_field_accepts_what_the_alternatives_accepted(
    branch: dict[str, Any], instances: list[Any]
) -> None:
    for alternatives in ([branch, {"type": "null"}], [{"type": "null"}, branch]):
        original = {"anyOf": alternatives, "default": None, "description": "here"}
        merged = merge_nullable(original)
        assert "anyOf" not in merged and merged["description"] == "here" and "default" in merged
        assert [_accepts(merged, i) for i in instances] == [_accepts(original, i) for i in instances]


@pytest.mark.parametrize(
    "alternatives",
    [
        [{"type": "string", "const": "A"}, {"type": "null"}],  # const applies to null too
        [{"type": "string", "not": {"enum": ["B"]}}, {"type": "null"}],
        [{"enum": ["A"]}, {"type": "null"}],  # no single type to extend
        [{"type": ["string", "integer"]}, {"type": "null"}],
        [{"type": "string"}, {"type": "integer"}],
        [{"type": "string"}, {"type": "null"}, {"type": "integer"}],
    ],
)
def test_alternatives_that_cannot_be_merged_exactly_are_left_as_they_are(alternatives: list[Any]) -> None:
    schema = {"anyOf": alternatives}
    assert merge_nullable(schema) == schema


@pytest.mark.parametrize("model", [LookupResult, ReadResult, ResetResult, KnowledgeMap])
def test_every_result_model_inlines(model: type) -> None:
    schema = published(TypeAdapter(model).json_schema())
    assert "$ref" not in json.dumps(schema)


def test_keywords_beside_a_reference_win_over_the_definition() -> None:
    schema = {
        "properties": {"level": {"$ref": "#/$defs/Level", "description": "here"}},
        "$defs": {"Level": {"type": "string", "description": "there", "enum": ["A"]}},
    }
    assert inline_definitions(schema) == {
        "properties": {"level": {"type": "string", "description": "here", "enum": ["A"]}}
    }


def test_recursive_and_foreign_references_are_refused() -> None:
    recursive = {
        "$ref": "#/$defs/Node",
        "$defs": {"Node": {"properties": {"next": {"$ref": "#/$defs/Node"}}}},
    }
    with pytest.raises(ValueError, match="recursive definition 'Node'"):
        inline_definitions(recursive)
    with pytest.raises(ValueError, match="only local"):
        inline_definitions({"$ref": "https://example.com/schema.json"})
    with pytest.raises(ValueError, match="only local"):
        inline_definitions({"$ref": "#/$defs/Missing", "$defs": {}})


async def test_listed_output_schemas_have_no_references(make_server: Any) -> None:
    async with Client(make_server(), mode="legacy") as client:
        tools = (await client.list_tools()).tools
        schemas = {tool.name: tool.output_schema for tool in tools}
        assert schemas["lookup_knowledge"] is not None
        for name, schema in schemas.items():
            assert schema is None or "$ref" not in json.dumps(schema), name
        # The SDK's client checks each structured result against the listed schema: a found result
        # and the DEDUPED repeat both pass it.
        levels = []
        for _ in range(2):
            result = await client.call_tool(
                "lookup_knowledge", {"query": "ORD-10293"}, meta={"session_id": "s"}
            )
            assert not result.is_error and result.structured_content is not None
            levels.append(result.structured_content["relevance_level"])
        # ORD-10293 is an order id no document names (other ORD- ids are): a found result that
        # is at most REFERENCE, since an unseen identifier is evidence against HIGHLY_RELEVANT.
        assert levels[0] in ("PRECISE", "HIGHLY_RELEVANT", "REFERENCE") and levels[1] == "DEDUPED"
