"""Tool-call hygiene: turn a model's raw arguments into ones the tool's schema accepts.

Pure module: no I/O. Scalars the model wrote as the wrong type ("3" for an integer, "true"
for a boolean) are coerced to the schema's type; the result is validated with `jsonschema`;
a call that still does not fit is rejected back to the model with the expected shape, so its
next turn can fix it instead of the tool failing obscurely. A schema is checked against its
meta-schema and compiled into a validator once (kept by its canonical JSON, the last
`VALIDATORS_KEPT` schemas): `jsonschema.validate` does both on every call, which was most of
what checking a call cost. Calls a model wrote as text instead
of structured tool calls (`<tool_call>name {...}</tool_call>` tags, or a reply that is a bare
`{"name": ..., "arguments": ...}` object naming an offered tool) are recovered as calls.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema  # type: ignore[import-untyped]

VALIDATORS_KEPT = 512
# Canonical JSON of a schema -> its validator, or None for a schema that is itself invalid.
_validators: dict[str, Any] = {}


def _coerce(value: Any, schema: dict[str, Any]) -> Any:
    kind = schema.get("type")
    if not isinstance(value, str) or kind not in ("integer", "number", "boolean"):
        if kind == "string" and isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        return value
    text = value.strip()
    try:
        if kind == "integer":
            return int(text)
        if kind == "number":
            return float(text)
    except ValueError:
        return value
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return value


def shape(schema: dict[str, Any]) -> str:
    """The expected arguments, as the model should write them."""
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    fields = {
        name: f"{(p or {}).get('type', 'any')}{'' if name in required else ' (optional)'}"
        for name, p in props.items()
    }
    return json.dumps(fields)


def check_arguments(raw: str, schema: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """(arguments, "") when they fit the schema after coercion, else (None, why)."""
    try:
        args = json.loads(raw) if raw.strip() else {}
    except ValueError:
        return None, f"arguments are not valid JSON; expected an object like {shape(schema)}"
    if not isinstance(args, dict):
        return None, f"arguments must be a JSON object like {shape(schema)}"
    props = schema.get("properties") or {}
    args = {k: _coerce(v, props.get(k) or {}) for k, v in args.items()}
    validator = _validator(schema)
    if validator is None:
        return args, ""  # the tool's own schema is broken; let the tool judge
    error = jsonschema.exceptions.best_match(validator.iter_errors(args))
    if error is not None:  # the error `jsonschema.validate` would raise
        return None, f"invalid arguments ({error.message}); expected {shape(schema)}"
    return args, ""


def _validator(schema: dict[str, Any]) -> Any:
    """The validator of `schema` (None if the schema is invalid), compiled once."""
    key = json.dumps(schema, sort_keys=True, default=repr)
    if key in _validators:
        return _validators[key]
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
        validator = cls(schema)
    except jsonschema.SchemaError:
        validator = None
    if len(_validators) >= VALIDATORS_KEPT:
        del _validators[next(iter(_validators))]
    _validators[key] = validator
    return validator


_TAG = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _call_from(text: str, names: frozenset[str]) -> tuple[str, str] | None:
    """(name, arguments JSON) from `{"name":..,"arguments":..}` or `name {json}`; else None."""
    text = text.strip()
    try:
        obj = json.loads(text)
    except ValueError:
        name, _, rest = text.partition(" ")
        if name in names:
            return name, rest.strip() or "{}"
        return None
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return str(obj["name"]), args if isinstance(args, str) else json.dumps(args)


def recover_text_calls(content: str | None, names: frozenset[str]) -> list[tuple[str, str]]:
    """Tool calls a model wrote as text (`<tool_call>` tags or a bare JSON object)."""
    if not content or not names:
        return []
    tagged = _TAG.findall(content)
    found = [c for t in tagged if (c := _call_from(t, names)) is not None]
    if found or tagged:
        return found
    single = _call_from(content, names)
    return [single] if single is not None else []
