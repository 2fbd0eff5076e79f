"""The field reference of ``docs/recipe.md``, generated from the recipe model.

``make generate`` (tools/generate.py) rewrites the part of ``docs/recipe.md`` between the
``<!-- fields:begin -->`` and ``<!-- fields:end -->`` markers with :func:`render_fields`; a
test fails when the committed file differs from what this produces, so the reference can never
drift from the schema.
"""

from __future__ import annotations

import json
from typing import Any

from datalane.spec.knobs import Knobs
from datalane.spec.model import json_schema
from datalane.spec.recipe import recipe_schema

__all__ = ["BEGIN", "END", "render_fields"]

BEGIN = "<!-- fields:begin -->"
END = "<!-- fields:end -->"


def _code(text: str) -> str:
    return "`" + text.replace("|", "\\|") + "`"


def _type(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        text = " \\| ".join(f"`{v}`" for v in schema["enum"])
    elif schema.get("type") == "array":
        text = f"list of {_type(schema['items'])}"
    elif schema.get("type") == "object" and "properties" not in schema:  # name -> value
        text = f"mapping of string to {_type(schema['additionalProperties'])}"
    else:
        text = str(schema.get("type"))
    return text + (" or null" if schema.get("nullable") else "")


def _bounds(schema: dict[str, Any]) -> str:
    parts = []
    if "minimum" in schema:
        op = ">" if schema.get("exclusiveMinimum") else ">="
        parts.append(f"{op} {schema['minimum']}")
    if "maximum" in schema:
        parts.append(f"<= {schema['maximum']}")
    if "minItems" in schema:
        parts.append(f"at least {schema['minItems']}")
    return ", ".join(parts)


def _shape(schema: dict[str, Any]) -> str:
    """An object's fields, without the description of where it is used."""
    return json.dumps({k: v for k, v in schema.items() if k != "description"}, sort_keys=True)


def _table(title: str, schema: dict[str, Any], prefix: str, out: list[str],
           nested: list[tuple[str, dict[str, Any], str]], tables: dict[str, str]) -> None:
    out += [f"### {title}", "", schema.get("description", ""), "",
            "| field | type | default | bounds | meaning |", "|---|---|---|---|---|"]
    required = set(schema.get("required", []))
    for name, prop in schema["properties"].items():
        item = prop["items"] if prop.get("type") == "array" else prop
        desc = prop.get("description", "")
        if item.get("type") == "object" and "properties" in item:
            # an object already described (eval streams' sources are sources) is not again
            same = tables.setdefault(_shape(item), f"{prefix}{name}")
            if same == f"{prefix}{name}":
                nested.append((same, item, f"{same}."))
            else:
                desc = f"{desc} Fields as in `{same}`.".strip()
        if name in required:
            default = "required"
        elif "default" in prop:
            default = _code(json.dumps(prop["default"]))
        else:
            default = "`null`" if prop.get("nullable") else "see below"
        desc = desc.replace("|", "\\|")
        out.append(f"| `{name}` | {_type(prop)} | {default} | {_bounds(prop)} | {desc} |")
    out.append("")


def render_fields() -> str:
    out: list[str] = []
    pending: list[tuple[str, dict[str, Any], str]] = [("recipe", recipe_schema(), "")]
    seen: set[str] = set()
    tables: dict[str, str] = {}  # an object's fields -> the title of its table
    while pending:
        title, schema, prefix = pending.pop(0)
        if title in seen:
            continue
        seen.add(title)
        _table(f"`{title}`" if prefix else "Top level", schema, prefix, out, pending, tables)
    out.append("### Knobs (not part of the recipe)")
    out.append("")
    _knobs = json_schema(Knobs)
    out += ["| knob | default | meaning |", "|---|---|---|"]
    for name, prop in _knobs["properties"].items():
        out.append(f"| `{name}` | {_code(json.dumps(prop.get('default')))} | "
                   f"{prop.get('description', '')} |")
    out.append("")
    return "\n".join(out)
