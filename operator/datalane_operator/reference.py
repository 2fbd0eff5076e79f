"""The DataPipeline field reference of ``docs/operator.md``, generated from the CRD schema.

``datalane-operator reference --write docs/operator.md`` rewrites the part of the file
between ``<!-- crd-reference:begin -->`` and ``<!-- crd-reference:end -->``; a test fails
when the committed text differs, so the reference never drifts from the schema. The recipe's
own fields are documented in ``docs/recipe.md`` (generated from the same model).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from datalane_operator.crd import crd_manifest
from datalane_operator.pipeline import QUANTITY

__all__ = ["BEGIN", "END", "render_reference", "rewrite"]

BEGIN = "<!-- crd-reference:begin -->"
END = "<!-- crd-reference:end -->"


def _type(s: dict[str, Any]) -> str:
    if s.get("x-kubernetes-int-or-string"):
        text = "quantity" if s.get("pattern") == f"^{QUANTITY}$" else "integer or string"
    elif "enum" in s:
        text = " \\| ".join(f"`{v}`" for v in s["enum"])
    elif s.get("type") == "array":
        text = f"list of {_type(s['items'])}"
    elif s.get("type") == "object" and "additionalProperties" in s:
        text = f"map of {_type(s['additionalProperties'])}"
    else:
        text = str(s.get("type"))
    return text + (" or null" if s.get("nullable") else "")


def _default(s: dict[str, Any]) -> str:
    if "default" not in s:
        return ""
    value = s["default"]
    if isinstance(value, bool):
        value = str(value).lower()
    return f"`{value}`" if value != {} else ""


def _bounds(s: dict[str, Any]) -> str:
    out = []
    if "minimum" in s:
        out.append(f"{'>' if s.get('exclusiveMinimum') else '>='} {s['minimum']}")
    if "maximum" in s:
        out.append(f"<= {s['maximum']}")
    if "maxItems" in s:
        out.append(f"at most {s['maxItems']}")
    for rule in s.get("x-kubernetes-validations") or []:
        if rule["rule"] == "self == oldSelf":
            out.append("immutable")
    return ", ".join(out)


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def _table(path: str, s: dict[str, Any], out: list[str],
           nested: list[tuple[str, dict[str, Any]]]) -> None:
    out += [f"#### `{path}`", "", _cell(s.get("description", "")), "",
            "| field | type | required | default | bounds | meaning |",
            "|---|---|---|---|---|---|"]
    required = set(s.get("required") or [])
    for name, prop in (s.get("properties") or {}).items():
        item = prop["items"] if prop.get("type") == "array" else prop
        sub = f"{path}.{name}" + ("[]" if prop.get("type") == "array" else "")
        if item.get("properties") and not sub.endswith(".recipe"):
            nested.append((sub, item))
        meaning = prop.get("description", "")
        if sub.endswith(".recipe"):
            meaning += " Fields: [docs/recipe.md](recipe.md)."
        out.append(f"| `{name}` | {_type(prop)} | {'yes' if name in required else ''} | "
                   f"{_default(prop)} | {_bounds(prop)} | {_cell(meaning)} |")
    out.append("")


def render_reference() -> str:
    """Markdown tables of ``spec`` and ``status``, the CEL rules and the printer columns."""
    version = crd_manifest()["spec"]["versions"][0]
    root = version["schema"]["openAPIV3Schema"]
    out: list[str] = []
    for top in ("spec", "status"):
        queue: list[tuple[str, dict[str, Any]]] = [(top, root["properties"][top])]
        while queue:
            path, schema = queue.pop(0)
            _table(path, schema, out, queue)
    out += ["#### Rules checked by the API server", ""]
    for rule in root.get("x-kubernetes-validations") or []:
        out.append(f"- `{rule['rule']}`: {rule['message']}")
    for rule in root["properties"]["spec"].get("x-kubernetes-validations") or []:
        out.append(f"- `{rule['rule']}` (on `spec`): {rule['message']}")
    out += ["", "#### `kubectl get dp` columns", "",
            "| column | from | shown |", "|---|---|---|"]
    for col in version["additionalPrinterColumns"]:
        shown = "with `-o wide`" if col.get("priority") else "always"
        out.append(f"| {col['name']} | `{col['jsonPath']}` | {shown} |")
    return "\n".join(out).rstrip() + "\n"


def rewrite(path: Path) -> bool:
    """Rewrite the generated section of ``path``; True if the file changed."""
    text = path.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    if not rest or END not in rest:
        raise ValueError(f"{path} lacks the markers {BEGIN} ... {END}")
    new = f"{head}{BEGIN}\n{render_reference()}{END}{tail}"
    if new != text:
        path.write_text(new)
        return True
    return False
