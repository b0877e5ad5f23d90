"""JSON a user was handed (a selection, a compressor's configuration, a run's records) checked
against a schema before anything reads it: :func:`validate` returns the object or raises one
ValueError naming the file, the key, the value found and what is accepted.

The schemas are JSON Schema (draft 2020-12) dictionaries, checked with ``jsonschema``; each file
that reads such JSON keeps its schema beside the code that reads it.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

INTEGER = {"type": "integer"}
COUNT = {"type": "integer", "minimum": 0}
POSITIVE = {"type": "integer", "minimum": 1}
NUMBER = {"type": "number"}
STRING = {"type": "string"}
BOOLEAN = {"type": "boolean"}
OBJECT = {"type": "object"}
INDICES = {"type": "array", "items": COUNT}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` or JSON null."""
    return {"anyOf": [schema, {"type": "null"}]}


def record(properties: dict[str, Any], *, required: tuple[str, ...] = (), closed: bool = False) -> dict[str, Any]:
    """An object with these ``properties`` (each optional unless ``required``); ``closed``:
    no other key."""
    return {"type": "object", "properties": properties, "required": list(required),
            "additionalProperties": not closed}


def validate(data: Any, schema: dict[str, Any], where: str) -> Any:
    """``data`` if it satisfies ``schema``; else a ValueError: ``where`` (the file), the key
    path, the value found and what is accepted. Of several faults the most specific one is named."""
    from jsonschema.exceptions import best_match

    error = best_match(_validator()(schema).iter_errors(data))
    if error is None:
        return data
    raise ValueError(f"{where}: {_describe(error)}")


@cache
def _validator():
    """Draft 2020-12 with an ``integer`` that is an int as written: 1.0 is refused where a count
    or seed is read (the draft counts it as an integer; Python's ranges and seeds do not)."""
    from jsonschema import Draft202012Validator, validators

    checker = Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool))
    return validators.extend(Draft202012Validator, type_checker=checker)


def load(path: str | Path, schema: dict[str, Any]) -> Any:
    """The JSON in ``path``, validated: a ValueError names the file for unreadable bytes, invalid
    JSON and any fault :func:`validate` finds."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start}); expected a JSON file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})") from None
    return validate(data, schema, str(path))


def _describe(error) -> str:
    """One line: where in the document, what was found, what is accepted."""
    at = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    at = at or "the top level"
    kind, expected, found = error.validator, error.validator_value, error.instance
    if kind == "required":
        missing = [key for key in expected if isinstance(found, dict) and key not in found]
        return f"{at}: missing {', '.join(map(repr, missing))} (required: {', '.join(expected)})"
    if kind == "additionalProperties" and isinstance(found, dict):
        known = sorted(error.schema.get("properties") or {})
        extra = sorted(key for key in found if key not in known)
        return f"{at}: unknown key {', '.join(map(repr, extra))}; accepted: {', '.join(known)}"
    if kind in ("anyOf", "oneOf") and error.context:
        accepted = " or ".join(_accepted(sub.validator, sub.validator_value) for sub in error.context)
        return f"{at} is {_show(found)}; expected {accepted}"
    return f"{at} is {_show(found)}; expected {_accepted(kind, expected)}"


def _accepted(kind: str, value: Any) -> str:
    if kind == "type":
        kinds = value if isinstance(value, list) else [value]
        return " or ".join(f"{'an' if k[0] in 'aeiou' else 'a'} {k}" for k in kinds)
    if kind == "enum":
        return f"one of {', '.join(map(repr, value))}"
    if kind == "const":
        return repr(value)
    if kind in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        sign = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}[kind]
        return f"a number {sign} {value}"
    if kind in ("minItems", "maxItems"):
        return f"{'at least' if kind == 'minItems' else 'at most'} {value} items"
    if kind in ("minLength", "maxLength"):
        return f"{'at least' if kind == 'minLength' else 'at most'} {value} characters"
    if kind == "pattern":
        return f"text matching {value!r}"
    return f"{kind} {value!r}"


def _show(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
