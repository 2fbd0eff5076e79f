"""Chat templates, found and rendered exactly as Hugging Face ``transformers`` renders them.

A chat template is Jinja code shipped with a model's tokenizer (``tokenizer_config.json``'s
``chat_template``, a ``chat_template.jinja`` beside it) or written into the recipe. Templates
come from the Hub, so they are untrusted code: like ``transformers``
(``transformers/utils/chat_template_utils.py``, 5.x) they run in Jinja's
``ImmutableSandboxedEnvironment`` with ``trim_blocks``, ``lstrip_blocks`` and the
``loopcontrols`` extension, the globals ``raise_exception``, ``strftime_now``, ``dict`` and
``namespace`` and the ``tojson`` filter ``transformers`` registers, and the ``{% generation %}``
block tag (rendered as its body). The context is the same too: ``messages``, ``tools`` and
``documents`` (null), ``add_generation_prompt`` and the named special tokens of the tokenizer
config (``bos_token``, ``eos_token``, ...); messages are copied as plain data with null-valued
keys dropped and the reasoning fields aliased, as ``apply_chat_template`` does.

Deliberate differences keep a stream reproducible and a lane alive: ``strftime_now`` formats
a fixed date (``chat.template_date``) instead of today's, and the sandbox is
:class:`~datalane.engine.documents.template_sandbox.BoundedSandbox`: templates that use
Jinja's ``random`` filter or ``lipsum`` are refused, only values with a fixed text are
printed, and each render is bounded in steps, time, size and depth (a render past a bound
raises, and the conversation is a bad record). A template is compiled once; rendering is
thread-safe.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
import jinja2.utils
import numpy as np

from datalane.engine.documents.template_sandbox import (
    BoundedSandbox,
    compile_template,
    render,
)
from datalane.engine.files import read_bytes
from datalane.spec.chat import ChatSpec
from datalane.spec.errors import ConfigError
from datalane.spec.recipe import TokenizerSpec

__all__ = ["SPECIAL_TOKEN_NAMES", "ChatTemplate", "TemplateSource", "find_template"]

#: The named special tokens ``transformers`` passes to every template (its
#: ``SPECIAL_TOKENS_ATTRIBUTES``), read from the tokenizer config where they are set.
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # as transformers aliases


@dataclass(frozen=True)
class TemplateSource:
    """A chat template's text, where it came from, and the special tokens it is given."""

    text: str
    origin: str  # the field and file it was read from, for error messages
    special_tokens: dict[str, str]


# -- finding the template --------------------------------------------------------------------

def _sibling(uri: str, name: str) -> str:
    """The object ``name`` in the folder of ``uri`` (a local path or an fsspec URI)."""
    head, sep, _ = uri.rpartition("/")
    return posixpath.join(head, name) if sep else name


def _read_optional(uri: str, where: str) -> bytes | None:
    """The content of ``uri``, or None if it does not exist."""
    import fsspec

    try:
        fs, path = fsspec.core.url_to_fs(uri)
        if not fs.exists(path):
            return None
    except (ValueError, ImportError, OSError) as e:
        raise ConfigError(f"{where} {uri!r} cannot be opened: {e}") from e
    return read_bytes(uri, where)


def _text(data: bytes, where: str, uri: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where} {uri!r} is not UTF-8 text (invalid byte at {e.start})") from e


def _config(data: bytes, where: str, uri: str) -> dict[str, Any]:
    try:
        obj = json.loads(_text(data, where, uri))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where} {uri!r} is not valid JSON: {e.msg} (line {e.lineno})") from e
    if not isinstance(obj, dict):
        raise ConfigError(f"{where} {uri!r} holds a JSON {type(obj).__name__}, not an object")
    return obj


def _special_tokens(config: Mapping[str, Any], where: str) -> dict[str, str]:
    """The named special tokens of a tokenizer config: strings or ``AddedToken`` objects."""
    out: dict[str, str] = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = config.get(name)
        if isinstance(value, Mapping):
            value = value.get("content")
        if value is None:
            continue
        if not isinstance(value, str):
            raise ConfigError(f"{where}: {name} is {type(value).__name__} {value!r:.60}; a "
                              f"special token is a string or an AddedToken object")
        out[name] = value
    return out


def _config_template(config: Mapping[str, Any], where: str, uri: str) -> str | None:
    """``chat_template`` of a config: a string, or the list of named templates ("default")."""
    value = config.get("chat_template")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, Mapping)}
        chosen = named.get("default")
        if isinstance(chosen, str):
            return chosen
        raise ConfigError(f"{where} {uri!r}: chat_template is a list of named templates "
                          f"without a 'default' one (names: {sorted(map(str, named))})")
    raise ConfigError(f"{where} {uri!r}: chat_template is {type(value).__name__}; expected a "
                      f"string or a list of named templates")


def find_template(spec: ChatSpec, tokenizer: TokenizerSpec, where: str) -> TemplateSource:
    """The template a chat source renders with, and the special tokens it sees.

    The template is ``template_text``, else the file ``template``, else the tokenizer
    config's ``chat_template`` (else a ``chat_template.jinja`` beside the config, where
    ``transformers`` 5 saves it). The config is ``tokenizer_config`` or, when that is null,
    the ``tokenizer_config.json`` beside ``tokenizer.uri``; its named special tokens are the
    template's ``bos_token``, ``eos_token``, ... Without a config (allowed when the recipe
    gives the template), the recipe's ``tokenizer.bos_token`` / ``eos_token`` / ``pad_token``
    are used.
    """
    cfg_field = f"{where}.tokenizer_config"
    if spec.tokenizer_config is not None:
        cfg_uri = spec.tokenizer_config
        config: dict[str, Any] | None = _config(read_bytes(cfg_uri, cfg_field), cfg_field,
                                                cfg_uri)
    else:
        cfg_uri = _sibling(tokenizer.uri, "tokenizer_config.json")
        cfg_field = f"{where}.tokenizer_config (null: beside tokenizer.uri)"
        raw = _read_optional(cfg_uri, cfg_field)
        config = None if raw is None else _config(raw, cfg_field, cfg_uri)
    if config is not None:
        tokens = _special_tokens(config, f"{cfg_field} {cfg_uri!r}")
    else:
        tokens = {"bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token}
        if tokenizer.pad_token is not None:
            tokens["pad_token"] = tokenizer.pad_token

    if spec.template_text is not None:
        return TemplateSource(spec.template_text, f"{where}.template_text", tokens)
    if spec.template is not None:
        field = f"{where}.template"
        text = _text(read_bytes(spec.template, field), field, spec.template)
        return TemplateSource(text, f"{field} {spec.template!r}", tokens)
    if config is None:
        raise ConfigError(
            f"{where} has no chat template: {where}.template and {where}.template_text are "
            f"null and there is no {cfg_uri!r} beside tokenizer.uri; set {where}.template, "
            f"{where}.template_text or {where}.tokenizer_config")
    inline = _config_template(config, cfg_field, cfg_uri)
    if inline is not None:
        return TemplateSource(inline, f"{cfg_field} {cfg_uri!r} (chat_template)", tokens)
    jinja_uri = _sibling(cfg_uri, "chat_template.jinja")
    raw = _read_optional(jinja_uri, cfg_field)
    if raw is None:
        raise ConfigError(
            f"{cfg_field} {cfg_uri!r} has no chat_template and there is no "
            f"chat_template.jinja beside it; set {where}.template or {where}.template_text")
    return TemplateSource(_text(raw, cfg_field, jinja_uri), f"{cfg_field} {jinja_uri!r}",
                          tokens)


# -- the Jinja environment transformers uses, bounded ------------------------------------------

class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: transformers marks assistant text with it
    (for ``return_assistant_tokens_mask``); here it renders its body, nothing else."""

    tags = {"generation"}  # noqa: RUF012 - jinja2's Extension API declares a class attribute

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # transformers' own tojson: no HTML escaping (Jinja's built-in one escapes <, >, &, ')
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


class _TemplateDict:
    """``dict(...)`` without attribute access to the type (as transformers restricts it)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """``namespace(...)`` refusing underscore-prefixed attributes (CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, "
                f"but got {name!r}. Please rename the attribute.")


def _environment(today: datetime) -> BoundedSandbox:
    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True,
                         extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception

    def strftime_now(format: str) -> str:  # fixed: the same stream on every day
        return today.strftime(format)

    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    env.bound_functions()
    return env


# -- messages as transformers hands them to the template -------------------------------------

def _plain(value: Any) -> Any:
    """transformers' ``_plain_template_data``: JSON-like data only, other objects as an inert
    ``"<TypeName>"`` placeholder (Arrow values such as datetimes render like that there too)."""
    t = type(value)
    if value is None or t in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, np.generic):  # np.bool_(False) would be a truthy placeholder
        return _plain(value.item())
    return f"<{t.__name__}>"


def plain_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """One message as ``apply_chat_template`` passes it: null-valued keys dropped, plain data,
    ``reasoning_content`` / ``thinking`` filled from any of the reasoning fields."""
    out = {k: (v if type(v) is str else _plain(v)) for k, v in message.items() if v is not None}
    for key in _REASONING_FIELDS:
        reasoning = out.get(key)
        if reasoning is not None:
            return {"thinking": reasoning, **out, "reasoning_content": reasoning}
    return out


class ChatTemplate:
    """A compiled chat template with its context; ``render`` is thread-safe."""

    def __init__(self, source: TemplateSource, today: datetime) -> None:
        self._template = compile_template(_environment(today), source.text, source.origin)
        self.source = source
        self.today = today
        self.sha256 = hashlib.sha256(source.text.encode("utf-8")).hexdigest()
        # Template.render copies the globals (a ChainMap) into every new context; building the
        # context from one prepared dict (shared=True) gives the same names for half the cost
        self._base: dict[str, Any] = {**dict(self._template.globals), **source.special_tokens,
                                      "tools": None, "documents": None}

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its source and date, compiled again where it is loaded (the compiled
        template holds functions that do not pickle): a sidecar's rank worker processes get
        the server's plan this way (sidecar/datalane_sidecar/remote.py)."""
        return ChatTemplate, (self.source, self.today)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        """The template's text for ``messages`` (already :func:`plain_message` copies).

        Raises what the template raises: ``jinja2.TemplateError`` for ``raise_exception``,
        undefined values, sandbox violations and the bounds of
        :mod:`~datalane.engine.documents.template_sandbox`, or any error of the template's
        own code.
        """
        t = self._template
        ctx = t.new_context({**self._base, "messages": messages,
                             "add_generation_prompt": add_generation_prompt}, shared=True)
        return render(t, ctx)
