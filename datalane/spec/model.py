"""A tiny typed-model layer: frozen dataclasses that load strictly and describe themselves.

Every persisted or user-written structure in datalane (recipe, knobs, resume points) is a
frozen dataclass whose fields carry a docstring and bounds in their metadata. This module
turns such a class into a strict loader (:func:`load`: unknown keys are errors, every error
names the dotted field path, the bad value and what would be valid), a canonical dict
(:func:`dump`) and a JSON Schema (:func:`json_schema`) - the single source the CRD is
generated from. Only the standard library is used, so the operator can import it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from datalane.spec.errors import ConfigError

__all__ = ["doc", "dump", "json_schema", "load"]

T = TypeVar("T")


def doc(
    text: str,
    *,
    default: Any = dataclasses.MISSING,
    factory: Any = dataclasses.MISSING,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    pattern: str | None = None,
    min_items: int | None = None,
    omit_default: bool = False,
    choices: tuple[str, ...] | None = None,
) -> Any:
    """Declare a dataclass field with its documentation and bounds.

    ``omit_default``: :func:`dump` leaves the field out while it holds its default, so a field
    added in a later version keeps the canonical form (and the fingerprint) of every recipe
    that does not use it. ``choices``: the strings a ``str`` field accepts (for sets that a
    registry defines, so that adding an entry is one line there)."""
    meta = {"doc": text, "ge": ge, "gt": gt, "le": le, "pattern": pattern, "min_items": min_items,
            "omit_default": omit_default, "choices": choices}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _is_optional(tp: Any) -> tuple[bool, Any]:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(get_args(tp)) == 2:
            return True, args[0]
    return False, tp


def _choices(tp: Any) -> tuple[Any, ...]:
    """The arms of a union that is not just ``X | None`` (``int | Literal["auto"]``: a count
    or a word); () for any other type."""
    if get_origin(tp) in (Union, types.UnionType) and not _is_optional(tp)[0]:
        return get_args(tp)
    return ()


def _type_name(tp: Any) -> str:
    optional, inner = _is_optional(tp)
    if optional:
        return f"{_type_name(inner)} or null"
    if _choices(tp):
        return " or ".join(_type_name(a) for a in _choices(tp))
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin is list:
        return f"list of {_type_name(get_args(tp)[0])}"
    if origin is dict:
        return f"mapping of string to {_type_name(get_args(tp)[1])}"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return {int: "integer", float: "number", str: "string", bool: "boolean"}.get(tp, str(tp))


def _check_bounds(value: Any, meta: Mapping[str, Any], where: str) -> None:
    import re

    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if meta.get("ge") is not None and value < meta["ge"]:
            raise ConfigError(f"{where} {value!r} must be >= {meta['ge']}")
        if meta.get("gt") is not None and value <= meta["gt"]:
            raise ConfigError(f"{where} {value!r} must be > {meta['gt']}")
        if meta.get("le") is not None and value > meta["le"]:
            raise ConfigError(f"{where} {value!r} must be <= {meta['le']}")
    if isinstance(value, str) and meta.get("pattern") and not re.fullmatch(meta["pattern"], value):
        raise ConfigError(f"{where} {value!r} does not match the pattern {meta['pattern']}")
    if isinstance(value, str) and meta.get("choices") and value not in meta["choices"]:
        valid = ", ".join(repr(c) for c in meta["choices"])
        raise ConfigError(f"{where} {value!r} is not one of {valid}")
    if isinstance(value, list) and meta.get("min_items") and len(value) < meta["min_items"]:
        raise ConfigError(f"{where} needs at least {meta['min_items']} item(s), got {len(value)}")


def _convert(tp: Any, value: Any, where: str) -> Any:
    optional, inner = _is_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where} must be {_type_name(tp)}, got null")
    tp = inner
    if _choices(tp):  # the first arm the value is
        for arm in _choices(tp):
            try:
                return _convert(arm, value, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where} must be {_type_name(tp)}, got {value!r}")
    origin = get_origin(tp)
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            valid = ", ".join(repr(c) for c in choices)
            raise ConfigError(f"{where} {value!r} is not one of {valid}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list, got {type(value).__name__} {value!r}")
        (item,) = get_args(tp)
        return [_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:  # string keys only (JSON, YAML mappings)
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where} must be a mapping, got {type(value).__name__} {value!r}")
        _, item = get_args(tp)
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(f"{where} keys must be strings, got {k!r}")
            out[k] = _convert(item, v, f"{where}.{k}")
        return out
    if dataclasses.is_dataclass(tp):
        return load(typing.cast(type[Any], tp), value, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        if not math.isfinite(value):  # NaN passes every bound check and breaks JSON
            raise ConfigError(f"{where} must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    raise TypeError(f"unsupported field type {tp!r} at {where}")  # a bug in a model, not input


def _hints(cls: type[Any]) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def load(cls: type[T], data: Any, where: str = "") -> T:
    """Build ``cls`` from a mapping, strictly: unknown keys and wrong types are errors."""
    label = where or cls.__name__.lower()
    if not isinstance(data, Mapping):
        raise ConfigError(f"{label} must be a mapping, got {type(data).__name__} {data!r}")
    fields = {f.name: f for f in dataclasses.fields(typing.cast(Any, cls))}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(str(key), list(fields), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(fields)}"
        raise ConfigError(f"{_join(where, str(key))} is not a known key{hint}")
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        path = _join(where, name)
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{path} is required ({f.metadata.get('doc', '')})".rstrip())
            continue
        value = _convert(hints[name], data[name], path)
        _check_bounds(value, f.metadata, path)
        kwargs[name] = value
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        validate(where)
    return obj


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def dump(obj: Any) -> Any:
    """Canonical plain-data form of a model object: every field, defaults included."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: dump(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if not (f.metadata.get("omit_default") and getattr(obj, f.name) == _default(f))}
    if isinstance(obj, (list, tuple)):
        return [dump(v) for v in obj]
    if isinstance(obj, dict):
        return {k: dump(v) for k, v in obj.items()}
    return obj


def _default(f: dataclasses.Field[Any]) -> Any:
    """A field's default value (a ``factory`` field's too: a fresh empty list, say)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _schema_of(tp: Any, meta: Mapping[str, Any]) -> dict[str, Any]:
    optional, inner = _is_optional(tp)
    origin = get_origin(inner)
    out: dict[str, Any]
    if origin is Literal:
        choices = list(get_args(inner))
        out = {"type": "string" if isinstance(choices[0], str) else "integer", "enum": choices}
    elif _choices(inner):  # the bounds below apply to the numbers only (JSON Schema)
        out = {"anyOf": [_schema_of(a, {}) for a in _choices(inner)]}
    elif origin is list:
        out = {"type": "array", "items": _schema_of(get_args(inner)[0], {})}
        if meta.get("min_items"):
            out["minItems"] = meta["min_items"]
    elif origin is dict:
        out = {"type": "object", "additionalProperties": _schema_of(get_args(inner)[1], {})}
    elif dataclasses.is_dataclass(inner):
        out = json_schema(typing.cast(type[Any], inner))
    else:
        out = {
            "type": {int: "integer", float: "number", str: "string", bool: "boolean"}[inner]
        }
    if meta.get("doc"):
        out["description"] = meta["doc"]
    for key, name in (("ge", "minimum"), ("le", "maximum")):
        if meta.get(key) is not None:
            out[name] = meta[key]
    if meta.get("gt") is not None:
        out["minimum"] = meta["gt"]
        out["exclusiveMinimum"] = True
    if meta.get("pattern"):
        out["pattern"] = meta["pattern"]
    if meta.get("choices"):
        out["enum"] = list(meta["choices"])
    if optional:
        out["nullable"] = True
    return out


def json_schema(cls: type[Any]) -> dict[str, Any]:
    """OpenAPI v3 / JSON Schema (structural, as Kubernetes CRDs need) of a model class."""
    hints = _hints(cls)
    props: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        props[f.name] = _schema_of(hints[f.name], f.metadata)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
        elif f.default is not dataclasses.MISSING and f.default is not None and not (
            dataclasses.is_dataclass(f.default)
        ):
            props[f.name]["default"] = f.default
    schema: dict[str, Any] = {"type": "object", "properties": props,
                              "additionalProperties": False}
    if cls.__doc__:
        schema["description"] = cls.__doc__.strip().splitlines()[0]
    if required:
        schema["required"] = required
    return schema
