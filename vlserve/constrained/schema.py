"""JSON schema → regex, with the checks that make "every output validates" true.

outlines-core builds the regex. Three things are added around it:
- the schema is checked against its metaschema (jsonschema), so a malformed schema is named;
- keywords outlines-core silently drops (minimum, uniqueItems, …) are refused, because an output
  that ignores them would not validate; an empty enum and contradictory bounds are refused as
  unsatisfiable;
- whitespace is fixed to Python's json.dumps layout (", " and ": "), so keys and separators are
  forced and the compressed FSM can jump over runs like `{"name": "`.
"""

from __future__ import annotations

import json

from outlines_core.json_schema import build_regex_from_schema

from vlserve.core.errors import ConstraintError

# Matches the empty string; outlines-core writes it wherever JSON allows whitespace, and we then
# rewrite each occurrence into the fixed layout. It cannot occur in a user pattern by accident.
_WS = r"(?:\x00\x01){0}"

_UNSUPPORTED = (
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "uniqueItems",
    "patternProperties", "minProperties", "maxProperties", "not", "if", "then", "else",
    "dependentRequired", "dependentSchemas", "contains", "propertyNames", "unevaluatedProperties",
)
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")


def parse_schema(json_schema: str | dict) -> dict:
    if isinstance(json_schema, str):
        try:
            json_schema = json.loads(json_schema)
        except json.JSONDecodeError as e:
            raise ConstraintError(f"json_schema is not valid JSON: {e}") from None
    if not isinstance(json_schema, dict):
        raise ConstraintError(f"json_schema must be a JSON object, got {type(json_schema).__name__}")
    try:
        import jsonschema
    except ImportError:  # the metaschema check is a nicety; outlines-core still rejects nonsense
        return json_schema
    try:
        jsonschema.validators.validator_for(json_schema).check_schema(json_schema)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise ConstraintError(f"invalid JSON schema at {where}: {e.message}") from None
    return json_schema


def _check(node, path: str) -> None:
    if not isinstance(node, dict):
        return
    for key in _UNSUPPORTED:
        if key in node:
            raise ConstraintError(
                f"JSON schema keyword '{key}' at {path or '/'} is not supported: "
                "constrained decoding could not guarantee it"
            )
    if "enum" in node and not node["enum"]:
        raise ConstraintError(f"unsatisfiable JSON schema: empty enum at {path or '/'}")
    for key in ("anyOf", "oneOf"):
        if key in node and not node[key]:
            raise ConstraintError(f"unsatisfiable JSON schema: empty {key} at {path or '/'}")
    for lo, hi in (("minLength", "maxLength"), ("minItems", "maxItems")):
        if lo in node and hi in node and node[lo] > node[hi]:
            raise ConstraintError(
                f"unsatisfiable JSON schema: {lo} {node[lo]} > {hi} {node[hi]} at {path or '/'}"
            )
    props = node.get("properties", {})
    for name in node.get("required", []):
        if name not in props:
            raise ConstraintError(
                f"JSON schema at {path or '/'} requires '{name}', which is not in its properties"
            )
    for key in _SUBSCHEMA_MAPS:
        for name, sub in node.get(key, {}).items():
            _check(sub, f"{path}/{key}/{name}")
    for key in _SUBSCHEMA_LISTS:
        for i, sub in enumerate(node.get(key, [])):
            _check(sub, f"{path}/{key}/{i}")
    for key in ("items", "additionalProperties"):
        _check(node.get(key), f"{path}/{key}")


def schema_to_regex(json_schema: str | dict) -> str:
    schema = parse_schema(json_schema)
    _check(schema, "")
    try:
        regex = build_regex_from_schema(json.dumps(schema), _WS)
    except (ValueError, TypeError) as e:
        raise ConstraintError(f"unsupported JSON schema: {e}".strip()) from None
    for structural, fixed in ((_WS + ":" + _WS, ": "), (":" + _WS, ": "),
                              (_WS + "," + _WS, ", "), ("," + _WS, ", "), (_WS, "")):
        regex = regex.replace(structural, fixed)
    return regex
