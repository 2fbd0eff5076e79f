"""Chat documents: rendering against transformers, loss masks, bad records, configuration.

The two shipped templates (``tests/data/chat``: a ChatML one in ``chatml/tokenizer_config.json``
and Llama 3's in ``llama3/chat_template.jinja``) are rendered by ``ChatKind`` and by
``transformers``' ``apply_chat_template`` with the same tokenizer: the text and the token ids
must be identical, and the loss mask must cover exactly the assistant spans, which are
computed here from transformers' own prefix renders (and, for a template with
``{% generation %}`` marks, from its ``return_assistant_tokens_mask``). One tiny conversation
per rule has its mask written out by hand.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer, processors
from transformers import PreTrainedTokenizerFast

from datalane.engine.documents.base import Rendered
from datalane.engine.documents.chat import LOSS_MASK, ChatKind
from datalane.engine.formats.base import MISSING
from datalane.engine.tokenize import TokenizerHandle
from datalane.spec import ConfigError, model
from datalane.spec.chat import ChatSpec
from datalane.spec.recipe import TokenizerSpec
from tests.support import paths

DATA = paths.DATA / "chat"
TOKENIZER = str(DATA / "tokenizer.json")
CONFIGS = {"chatml": DATA / "chatml" / "tokenizer_config.json",
           "llama3": DATA / "llama3" / "tokenizer_config.json"}
WHERE = "sources[0].chat"


def U(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def A(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def S(text: str) -> dict[str, str]:
    return {"role": "system", "content": text}


CONVERSATIONS = {
    "multi_turn": [U("What is 2+2?"), A("4."), U("And 3+3?"), A("6, of course."),
                   U("Thanks!"), A("You're welcome.")],
    "system_prompt": [S("You are terse."), U("Name a colour."), A("Blue.")],
    "empty_turns": [U(""), A(""), U("still there?"), A("Yes.")],
    "unicode": [U("Grüße aus Köln 🙂 — 東京は\uff1f"), A("こんにちは! Ça va ? \u0041\u030a Straße"),
                U("  spaces around\n\n"), A("\tindented\nlines  ")],
    "tool_turn": [U("Weather?"), A("Calling the tool."), {"role": "tool", "content": "21 C"},
                  A("It is 21 degrees.")],
    "ends_with_user": [U("Hi"), A("Hello."), U("Bye")],
}


@pytest.fixture(scope="module")
def handle() -> TokenizerHandle:
    return TokenizerHandle.load(TokenizerSpec(uri=TOKENIZER))


def kind(handle: TokenizerHandle, where: str = WHERE, **spec: Any) -> ChatKind:
    return ChatKind(model.load(ChatSpec, spec, where), handle, where)


def config_kind(handle: TokenizerHandle, name: str, **spec: Any) -> ChatKind:
    return kind(handle, tokenizer_config=str(CONFIGS[name]), **spec)


def hf_tokenizer(name: str, template: str | None = None) -> Any:
    """transformers' tokenizer with the same tokenizer.json, template and special tokens."""
    config = json.loads(CONFIGS[name].read_text())
    if template is None:
        template = config.get("chat_template") or (
            CONFIGS[name].parent / "chat_template.jinja").read_text()
    tokens = {k: (v["content"] if isinstance(v, dict) else v) for k, v in config.items()
              if k.endswith("_token") and v is not None}
    return PreTrainedTokenizerFast(tokenizer_file=TOKENIZER, chat_template=template, **tokens)


@pytest.fixture(scope="module")
def hf() -> dict[str, Any]:
    return {name: hf_tokenizer(name) for name in CONFIGS}


def one(k: ChatKind, value: Any) -> tuple[list[int], list[int]]:
    """``(input_ids, loss_mask)`` of one record that must render."""
    doc, reason, detail = k.render(value)
    assert doc is not None, (reason, detail)
    cols, offsets, lengths = k.tokenize([doc])
    assert list(cols) == ["input_ids", "loss_mask"]
    assert cols["input_ids"].dtype == np.int32 and cols["loss_mask"].dtype == np.uint8
    assert offsets.tolist() == [0, len(cols["input_ids"])]
    assert lengths.tolist() == [len(cols["input_ids"])]  # no BOS/EOS added by datalane
    return cols["input_ids"].tolist(), cols["loss_mask"].tolist()


def hf_spans_mask(tok: Any, msgs: list[dict[str, str]], turns: list[int]) -> list[int]:
    """The mask from transformers' prefix renders, counted in tokens: assistant turn i is the
    tokens of apply_chat_template(msgs[:i+1]) after those of msgs[:i] with the generation
    prompt (each prefix's tokens must be a prefix of the whole conversation's)."""
    full = tok.apply_chat_template(msgs, tokenize=True, return_dict=False)
    mask = [0] * len(full)
    for i in turns:
        head = tok.apply_chat_template(msgs[:i], add_generation_prompt=True, tokenize=True,
                                       return_dict=False)
        turn = tok.apply_chat_template(msgs[:i + 1], tokenize=True, return_dict=False)
        assert full[:len(turn)] == turn and turn[:len(head)] == head
        mask[len(head):len(turn)] = [1] * (len(turn) - len(head))
    return mask


def assistants(msgs: list[dict[str, str]]) -> list[int]:
    return [i for i, m in enumerate(msgs) if m["role"] == "assistant"]


# -- against transformers ------------------------------------------------------------------

@pytest.mark.parametrize("conv", sorted(CONVERSATIONS))
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_text_and_token_ids_are_those_of_apply_chat_template(
        handle: TokenizerHandle, hf: dict[str, Any], name: str, conv: str) -> None:
    msgs = CONVERSATIONS[conv]
    k = config_kind(handle, name)
    doc, _, _ = k.render(msgs)
    assert doc is not None
    assert doc.text == hf[name].apply_chat_template(msgs, tokenize=False)
    ids, _ = one(k, msgs)
    assert ids == hf[name].apply_chat_template(msgs, tokenize=True, return_dict=False)
    assert len(ids) > 10


@pytest.mark.parametrize("conv", sorted(CONVERSATIONS))
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_mask_is_the_assistant_spans_of_the_prefix_renders(
        handle: TokenizerHandle, hf: dict[str, Any], name: str, conv: str) -> None:
    msgs = CONVERSATIONS[conv]
    _, mask = one(config_kind(handle, name), msgs)
    assert mask == hf_spans_mask(hf[name], msgs, assistants(msgs))
    assert 0 < sum(mask) < len(mask)


@pytest.mark.parametrize("conv", sorted(CONVERSATIONS))
def test_the_mask_is_transformers_assistant_tokens_mask_of_a_generation_template(
        handle: TokenizerHandle, conv: str) -> None:
    """chatml_generation.jinja marks each assistant content and end-of-turn with
    {% generation %}: transformers' return_assistant_tokens_mask is then the mask."""
    template = str(DATA / "chatml_generation.jinja")
    msgs = CONVERSATIONS[conv]
    tok = hf_tokenizer("chatml", (DATA / "chatml_generation.jinja").read_text())
    out = tok.apply_chat_template(msgs, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True)
    k = kind(handle, template=template, tokenizer_config=str(CONFIGS["chatml"]))
    ids, mask = one(k, msgs)
    assert ids == out["input_ids"]
    assert mask == out["assistant_masks"]
    # the {% generation %} tag renders as its body: the same tokens as the plain template
    assert ids == one(config_kind(handle, "chatml"), msgs)[0]


def test_messages_reach_the_template_as_transformers_passes_them(handle: TokenizerHandle) -> None:
    """Null-valued keys are dropped, extra keys and the reasoning aliases are visible, tools and
    documents are null, the config's special tokens are set."""
    template = ("{% for m in messages %}[{{ m.role }}|{{ m.content }}|"
                "{{ m.tool_calls is defined }}|{{ m.name | default('-') }}|"
                "{{ m.reasoning_content | default('-') }}|{{ m.thinking | default('-') }}]"
                "{% endfor %}{{ tools is none }}{{ documents is none }}{{ eos_token }}"
                "{{ pad_token }}{{ bos_token is defined }}{{ [1, 'é'] | tojson }}")
    msgs = [{"role": "user", "content": "q", "name": "ann", "tool_calls": None},
            {"role": "assistant", "content": "a", "reasoning": "because"}]
    k = kind(handle, template_text=template, tokenizer_config=str(CONFIGS["chatml"]),
             train_on="all")  # the text after the loop makes no turn a prefix of the next
    doc, _, _ = k.render(msgs)
    assert doc is not None
    expected = ("[user|q|False|ann|-|-][assistant|a|False|-|because|because]TrueTrue"
                "<|im_end|><|im_end|>False[1, \"é\"]")
    assert doc.text == expected
    assert doc.text == hf_tokenizer("chatml", template).apply_chat_template(msgs, tokenize=False)


# -- masks by hand -------------------------------------------------------------------------

CHATML_MINI = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
               "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
               "{% endif %}")


def test_hand_computed_mask_of_a_tiny_chatml_conversation(handle: TokenizerHandle) -> None:
    k = kind(handle, template_text=CHATML_MINI)
    ids, mask = one(k, [U("hi"), A("yo")])
    tokens = [handle.tokenizer.id_to_token(i) for i in ids]
    # header tokens 0; "yo", <|im_end|> and the newline after it are the assistant's turn
    expected = [("<|im_start|>", 0), ("u", 0), ("s", 0), ("er", 0), ("Ċ", 0), ("h", 0),
                ("i", 0), ("<|im_end|>", 0), ("Ċ", 0),
                ("<|im_start|>", 0), ("a", 0), ("ss", 0), ("i", 0), ("st", 0), ("an", 0),
                ("t", 0), ("Ċ", 0),
                ("y", 1), ("o", 1), ("<|im_end|>", 1), ("Ċ", 1)]
    assert list(zip(tokens, mask, strict=True)) == expected


QA = ("{% for m in messages %}{% if m['role'] == 'user' %}Q: {{ m['content'] }}\n"
      "{% else %}A: {{ m['content'] }}\n{% endif %}{% endfor %}"
      "{% if add_generation_prompt %}A: {% endif %}")
# "Q: x\nA: hello\n": the generation prompt "A: " ends with a space, and the tokenizer joins
# that space to the answer's "h" ("Ġh"): the token holds the span's first character, so it is
# trained, as transformers' return_assistant_tokens_mask marks it (char_to_token)
QA_EXPECTED = [("Q", 0), (":", 0), ("Ġx", 0), ("Ċ", 0), ("A", 0), (":", 0), ("Ġh", 1),
               ("e", 1), ("ll", 1), ("o", 1), ("Ċ", 1)]


def test_the_token_holding_the_first_character_of_a_span_is_trained(
        handle: TokenizerHandle) -> None:
    k = kind(handle, template_text=QA)
    doc, _, _ = k.render([U("x"), A("hello")])
    assert doc == Rendered("Q: x\nA: hello\n", ((8, 14),))
    ids, mask = one(k, [U("x"), A("hello")])
    tokens = [handle.tokenizer.id_to_token(i) for i in ids]
    assert list(zip(tokens, mask, strict=True)) == QA_EXPECTED


def trimming_tokenizer(source: str, folder: Path) -> TokenizerHandle:
    """The tokenizer ``source`` with a ByteLevel post-processor that trims offsets."""
    tok = Tokenizer.from_file(source)
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return TokenizerHandle.load(TokenizerSpec(uri=str(path)))


def test_offsets_are_taken_before_a_post_processor_trims_them(tmp_path: Path) -> None:
    """A ByteLevel post-processor with trim_offsets reports "Ġh" as starting at "h"; the mask
    must not change with it."""
    trimming = trimming_tokenizer(TOKENIZER, tmp_path)
    enc = trimming.tokenizer.encode("Q: x\nA: hello\n", add_special_tokens=False)
    assert enc.offsets[6] == (8, 9)  # the premise: trimmed past the space
    k = kind(trimming, template_text=QA)
    ids, mask = one(k, [U("x"), A("hello")])
    tokens = [trimming.tokenizer.id_to_token(i) for i in ids]
    assert list(zip(tokens, mask, strict=True)) == QA_EXPECTED


def test_mask_when_a_normalizer_drops_characters(tmp_path: Path) -> None:
    """Characters no token holds (a normalizer removed them) use every token's offsets."""
    from tokenizers import normalizers

    tok = Tokenizer.from_file(TOKENIZER)
    tok.normalizer = normalizers.Replace("~", "")
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    h = TokenizerHandle.load(TokenizerSpec(uri=str(path)))
    k = kind(h, template_text=("{% for m in messages %}{% if m['role'] == 'user' %}"
                               "{{ m['content'] }}|{% else %}~{{ m['content'] }}~|{% endif %}"
                               "{% endfor %}"))
    conv = [U("x"), A("rr"), U("y")]
    doc, _, _ = k.render(conv)
    assert doc == Rendered("x|~rr~|y|", ((2, 7),))  # the span starts on a dropped "~"
    assert h.tokenizer.encode(doc.text, add_special_tokens=False).char_to_token(2) is None
    ids, mask = one(k, conv)
    tokens = [h.tokenizer.id_to_token(i) for i in ids]
    assert list(zip(tokens, mask, strict=True)) == [("x", 0), ("|", 0), ("rr", 1), ("|", 1),
                                                    ("y", 0), ("|", 0)]


def test_each_batch_document_gets_its_own_mask(handle: TokenizerHandle) -> None:
    k = kind(handle, template_text=QA)
    docs = [k.render(c)[0] for c in ([U("x"), A("hello")], [U("x")], [A("hello")])]
    assert docs[1] is None  # no assistant turn
    batch = [d for d in docs if d is not None]
    cols, offsets, lengths = k.tokenize(batch)
    assert offsets.tolist() == [0, 11, 18] and lengths.tolist() == [11, 7]
    # "A: hello\n" alone: A : Ġh e ll o Ċ; the head "A: " is the generation prompt
    assert cols["loss_mask"].tolist() == [m for _, m in QA_EXPECTED] + [0, 0, 1, 1, 1, 1, 1]
    assert k.tokenize([])[0]["loss_mask"].tolist() == []


# -- train_on ------------------------------------------------------------------------------

TWO_TURNS = [U("hi"), A("yo"), U("hi"), A("ok")]
# CHATML_MINI renders each turn as <|im_start|> role \n content <|im_end|> \n:
# user turn "hi": 9 tokens, assistant header 8 tokens, then "yo"/"ok" 2 tokens + end 2 tokens
_USER = [0] * 9
_HEAD = [0] * 8
_TRAINED = [1, 1, 1, 1]
_UNTRAINED = [0, 0, 0, 0]


@pytest.mark.parametrize(("train_on", "expected"), [
    ("assistant", _USER + _HEAD + _TRAINED + _USER + _HEAD + _TRAINED),
    ("last_assistant", _USER + _HEAD + _UNTRAINED + _USER + _HEAD + _TRAINED),
    ("all", [1] * 42),
])
def test_train_on(handle: TokenizerHandle, train_on: str, expected: list[int]) -> None:
    ids, mask = one(kind(handle, template_text=CHATML_MINI, train_on=train_on), TWO_TURNS)
    assert mask == expected
    assert ids == one(kind(handle, template_text=CHATML_MINI), TWO_TURNS)[0]


def test_train_on_all_keeps_conversations_without_an_assistant(handle: TokenizerHandle) -> None:
    _, mask = one(kind(handle, template_text=CHATML_MINI, train_on="all"), [U("hi")])
    assert mask == [1] * 9
    for mode in ("assistant", "last_assistant"):
        doc, reason, detail = kind(handle, template_text=CHATML_MINI,
                                   train_on=mode).render([U("hi")])
        assert (doc, reason) == (None, "no_assistant")
        assert "no assistant turn" in str(detail) and mode in str(detail)


# -- bad records ---------------------------------------------------------------------------

BAD = [
    (MISSING, "not_messages", "no value in field 'messages'"),
    (None, "not_messages", "no value in field 'messages'"),
    ("hello", "not_messages", "holds str, not a list of messages"),
    ({"role": "user", "content": "x"}, "not_messages", "holds dict"),
    ([], "not_messages", "empty conversation"),
    ([U("x"), "y"], "not_messages", "messages[1] is str"),
    ([{"role": "user"}], "not_messages", "messages[0] has no 'content'"),
    ([{"content": "x"}], "not_messages", "messages[0] has no 'role'"),
    ([U("x"), {"role": "robot", "content": "x"}], "bad_role", "messages[1].role is 'robot'"),
    ([{"role": 3, "content": "x"}], "bad_role", "messages[0].role is 3"),
    ([U("x"), {"role": "assistant", "content": None}], "not_text",
     "messages[1].content is null"),
    ([{"role": "user", "content": [{"type": "text", "text": "x"}]}], "not_text",
     "messages[0].content is list"),
    ([U("x"), {"role": "assistant", "content": 5}], "not_text", "messages[1].content is int"),
    ([U("x"), U("y")], "no_assistant", "no assistant turn"),
    # a lone surrogate (JSON's "\ud800") would make the tokenizer refuse the whole batch
    ([U("hi\ud800"), A("y")], "invalid_unicode",
     "messages[0].content holds the lone surrogate U+D800 at character 2"),
]


@pytest.mark.parametrize(("value", "reason", "detail"), BAD)
def test_bad_records(handle: TokenizerHandle, value: Any, reason: str, detail: str) -> None:
    k = config_kind(handle, "chatml")
    doc, got, why = k.render(value)
    assert (doc, got) == (None, reason)
    assert detail in str(why)
    assert got in k.bad_reasons


def test_the_bad_record_reasons(handle: TokenizerHandle) -> None:
    assert config_kind(handle, "chatml").bad_reasons == {
        "not_messages", "bad_role", "not_text", "invalid_unicode", "no_assistant",
        "chat_template"}
    assert ChatKind.columns == (LOSS_MASK,)
    assert (LOSS_MASK.name, LOSS_MASK.dtype, LOSS_MASK.pad, LOSS_MASK.default) == (
        "loss_mask", "uint8", 0, 1)


def test_a_lone_surrogate_the_template_prints_from_another_key_is_a_bad_record(
        handle: TokenizerHandle) -> None:
    # the contents are checked by name; a message's other keys reach the template as they are
    template = "{% for m in messages %}{{ m.name }}:{{ m.content }}\n{% endfor %}"
    doc, reason, detail = kind(handle, template_text=template).render(
        [{"role": "user", "content": "x", "name": "a\udc80"}, A("y")])
    assert (doc, reason, detail) == (
        None, "invalid_unicode",
        "the rendered conversation holds the lone surrogate U+DC80 at character 1")


def test_what_the_template_rejects_is_a_chat_template_record(handle: TokenizerHandle) -> None:
    doc, reason, detail = config_kind(handle, "chatml").render([U("x"), S("late"), A("y")])
    assert (doc, reason) == (None, "chat_template")
    assert "System message must be at the beginning." in str(detail)
    assert "TemplateError" in str(detail) and "messages[:3]" in str(detail)


def test_a_template_error_on_a_prefix_is_a_chat_template_record(handle: TokenizerHandle) -> None:
    k = kind(handle, template_text="{{ messages[0]['content'] }}{% if add_generation_prompt %}"
                                   ">{% endif %}")
    doc, reason, detail = k.render([A("x")])
    assert (doc, reason) == (None, "chat_template")
    assert "messages[:0] with add_generation_prompt" in str(detail)
    assert "UndefinedError" in str(detail)


def test_a_template_that_is_not_prefix_consistent_is_a_chat_template_record(
        handle: TokenizerHandle) -> None:
    # the ChatML config prints its default system prompt only once a message exists, so a
    # conversation opening with the assistant has no generation prompt before its turn
    doc, reason, detail = config_kind(handle, "chatml").render([A("hi"), U("x"), A("y")])
    assert (doc, reason) == (None, "chat_template")
    assert "not prefix-consistent" in str(detail)
    assert "messages[:0] with add_generation_prompt is not a prefix of messages[:1]" in str(detail)
    # a template that rewrites earlier turns (drops all but the last assistant's text)
    k = kind(handle, template_text=("{% for m in messages %}{% if m.role != 'assistant' or "
                                    "loop.last %}{{ m.content }};{% endif %}{% endfor %}"))
    doc, reason, detail = k.render([U("q"), A("a"), U("q2"), A("b")])
    assert (doc, reason) == (None, "chat_template")
    assert "messages[:2] is not a prefix of the whole conversation" in str(detail)
    # under last_assistant only the last turn's prefixes are needed, and they are consistent
    k = kind(handle, train_on="last_assistant", template_text=(
        "{% for m in messages %}{% if m.role != 'assistant' or loop.last %}{{ m.content }};"
        "{% endif %}{% endfor %}"))
    assert k.render([U("q"), A("a"), U("q2"), A("b")]) == (
        Rendered("q;q2;b;", ((5, 7),)), None, None)


# -- configuration -------------------------------------------------------------------------

def test_no_template_anywhere(handle: TokenizerHandle) -> None:
    with pytest.raises(ConfigError, match=r"sources\[0\]\.chat has no chat template: .*"
                                          r"tokenizer_config\.json"):
        kind(handle)  # tests/data/chat has no tokenizer_config.json beside tokenizer.json


def test_the_tokenizer_config_beside_the_tokenizer(tmp_path: Path) -> None:
    shutil.copy(TOKENIZER, tmp_path / "tokenizer.json")
    shutil.copy(CONFIGS["chatml"], tmp_path / "tokenizer_config.json")
    h = TokenizerHandle.load(TokenizerSpec(uri=str(tmp_path / "tokenizer.json")))
    implied = kind(h)
    assert implied.identity() == config_kind(h, "chatml").identity()
    assert one(implied, CONVERSATIONS["multi_turn"]) == one(config_kind(h, "chatml"),
                                                            CONVERSATIONS["multi_turn"])


def test_without_a_config_the_recipe_names_the_special_tokens(tmp_path: Path) -> None:
    h = TokenizerHandle.load(TokenizerSpec(uri=TOKENIZER, bos_token="<|im_start|>"))
    k = kind(h, template_text="{{ bos_token }}{{ eos_token }}{{ pad_token is defined }}"
                              "{% for m in messages %}{{ m.content }}{% endfor %}")
    doc, _, _ = k.render([A("x")])
    assert doc is not None and doc.text == "<|im_start|><|eos|>Falsex"
    assert k.identity()["special_tokens"] == {"bos_token": "<|im_start|>",
                                              "eos_token": "<|eos|>"}


def test_a_list_of_named_templates_uses_the_default(handle: TokenizerHandle,
                                                    tmp_path: Path) -> None:
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps({"eos_token": "<|eos|>", "chat_template": [
        {"name": "tool_use", "template": "TOOLS"},
        {"name": "default", "template": "{% for m in messages %}{{ m.content }}{% endfor %}"}]}))
    doc, _, _ = kind(handle, tokenizer_config=str(path)).render([A("x"), A("y")])
    assert doc is not None and doc.text == "xy"
    path.write_text(json.dumps({"chat_template": [{"name": "tool_use", "template": "T"}]}))
    with pytest.raises(ConfigError, match=r"without a 'default' one \(names: \['tool_use'\]\)"):
        kind(handle, tokenizer_config=str(path))


def test_a_config_without_a_template(handle: TokenizerHandle, tmp_path: Path) -> None:
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps({"eos_token": "<|eos|>"}))
    with pytest.raises(ConfigError, match=r"has no chat_template and there is no "
                                          r"chat_template\.jinja beside it"):
        kind(handle, tokenizer_config=str(path))
    # with the template from the recipe, the config still gives the special tokens
    k = kind(handle, tokenizer_config=str(path), template_text="{{ eos_token }}")
    assert k.render([A("x")]) == (Rendered("<|eos|>", ()), None, None)


@pytest.mark.parametrize(("spec", "message"), [
    ({"template": "/nonexistent/chat.jinja"},
     r"sources\[0\]\.chat\.template '/nonexistent/chat\.jinja' does not exist"),
    ({"tokenizer_config": "/nonexistent/tokenizer_config.json"},
     r"sources\[0\]\.chat\.tokenizer_config '/nonexistent/tokenizer_config\.json' does not "
     r"exist"),
    ({"template_text": "{% for m in messages %}{{ m.content }}"},
     r"sources\[0\]\.chat\.template_text is not a valid Jinja template: .*'endfor'.*line 1"),
    ({"template_text": "{{ messages | random }}"},
     r"template_text uses the 'random' filter \(line 1\)"),
    ({"template_text": "{{ lipsum(1) }}"}, r"template_text uses lipsum\(\)"),
])
def test_configuration_errors(handle: TokenizerHandle, spec: dict[str, Any],
                              message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        kind(handle, **spec)


def test_a_template_file_that_does_not_compile(handle: TokenizerHandle, tmp_path: Path) -> None:
    path = tmp_path / "bad.jinja"
    path.write_text("line one\n{% if %}\n")
    with pytest.raises(ConfigError, match=r"sources\[0\]\.chat\.template '.*bad\.jinja' is not "
                                          r"a valid Jinja template: .*\(line 2\)"):
        kind(handle, template=str(path))
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match=r"is not UTF-8 text"):
        kind(handle, template=str(path))
    path.write_text("[1,")
    with pytest.raises(ConfigError, match=r"tokenizer_config '.*bad\.jinja' is not valid JSON"):
        kind(handle, tokenizer_config=str(path))


@pytest.mark.parametrize(("data", "message"), [
    ({"template": "a.jinja", "template_text": "x"},
     r"chat\.template and chat\.template_text are both set"),
    ({"train_on": "user"}, r"chat\.train_on 'user' is not one of 'assistant', 'all', "
                           r"'last_assistant'"),
    ({"template_date": "2024-02-30"}, r"chat\.template_date '2024-02-30' is not a date"),
    ({"template_date": "today"}, r"chat\.template_date 'today' does not match"),
    ({"template_text": "  "}, r"chat\.template_text '  ' does not match"),
    ({"messages_field": ""}, r"chat\.messages_field '' does not match"),
    ({"messages": "m"}, r"chat\.messages is not a known key; did you mean 'messages_field'"),
])
def test_chat_spec_is_loaded_strictly(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        model.load(ChatSpec, data, "chat")


def test_chat_spec_defaults_and_schema() -> None:
    spec = model.load(ChatSpec, {}, "chat")
    assert model.dump(spec) == {"messages_field": "messages", "template": None,
                                "template_text": None, "tokenizer_config": None,
                                "train_on": "assistant", "template_date": "2024-07-26"}
    schema = model.json_schema(ChatSpec)
    assert schema["properties"]["train_on"]["enum"] == ["assistant", "all", "last_assistant"]
    assert schema["additionalProperties"] is False
    fixed = spec.resolved(lambda p: "/base/" + p)
    assert (fixed.template, fixed.tokenizer_config) == (None, None)
    both = model.load(ChatSpec, {"template": "t.jinja", "tokenizer_config": "c.json"})
    fixed = both.resolved(lambda p: "/base/" + p)
    assert (fixed.template, fixed.tokenizer_config) == ("/base/t.jinja", "/base/c.json")


def test_strftime_now_is_the_fixed_template_date(handle: TokenizerHandle) -> None:
    text = "{{ strftime_now('%d %b %Y') }}{% for m in messages %}{{ m.content }}{% endfor %}"
    assert kind(handle, template_text=text).render([A("!")])[0] == Rendered("26 Jul 2024!",
                                                                          ((11, 12),))
    later = kind(handle, template_text=text, template_date="2025-01-02")
    assert later.render([A("!")])[0] == Rendered("02 Jan 2025!", ((11, 12),))


def test_identity(handle: TokenizerHandle) -> None:
    base = config_kind(handle, "llama3").identity()
    assert base["kind"] == "chat" and base["train_on"] == "assistant"
    assert base["special_tokens"] == {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    import hashlib

    text = (DATA / "llama3" / "chat_template.jinja").read_bytes()
    assert base["template_sha256"] == hashlib.sha256(text).hexdigest()
    assert config_kind(handle, "llama3").identity() == base
    assert config_kind(handle, "llama3", train_on="all").identity()["train_on"] == "all"
    assert config_kind(handle, "chatml").identity()["template_sha256"] != base["template_sha256"]


def test_a_conversation_is_never_truncated(handle: TokenizerHandle) -> None:
    """Longer than any sequence: all its tokens come out, the packers split it."""
    msgs = [U("q " * 3000), A("a " * 3000)]
    ids, mask = one(config_kind(handle, "chatml"), msgs)
    assert len(ids) > 6000
    # "a", 2,999 " a", the trailing " ", <|im_end|> and the newline (the demo vocab has "Ġa")
    assert sum(mask) == 1 + 2999 + 1 + 2


def test_overlapping_turn_spans_are_joined(handle: TokenizerHandle) -> None:
    """A template that leaves out the last message under add_generation_prompt makes the
    generation prompt of turn 2 ("q;") end inside turn 1's span ("q;a;"): the mask is the
    union of the spans."""
    k = kind(handle, template_text=("{% for m in messages %}{% if not (add_generation_prompt "
                                    "and loop.last) %}{{ m.content }};{% endif %}{% endfor %}"))
    doc, _, _ = k.render([U("q"), A("a"), A("b")])
    assert doc == Rendered("q;a;b;", ((0, 6),))  # (0, 4) and (2, 6)
    ids, mask = one(k, [U("q"), A("a"), A("b")])
    assert len(ids) == 6 and mask == [1] * 6


def test_block_lines_are_trimmed_as_transformers_trims_them(handle: TokenizerHandle) -> None:
    """trim_blocks and lstrip_blocks: a line holding only an indented block tag renders as
    nothing (the way most Hub templates are written); {% continue %} (loopcontrols) works."""
    template = ("{% for m in messages %}\n"
                "    {% if m.role == 'system' %}{% continue %}{% endif %}\n"
                "    {% if m.role == 'user' %}\n"
                "U: {{ m.content }}\n"
                "    {% else %}\n"
                "A: {{ m.content }}\n"
                "    {% endif %}\n"
                "{% endfor %}\n"
                "{% if add_generation_prompt %}A: {% endif %}\n")
    msgs = [S("hidden"), U("q"), A("a")]
    doc, _, _ = kind(handle, template_text=template).render(msgs)
    assert doc == Rendered("U: q\nA: a\n", ((8, 10),))
    assert doc.text == hf_tokenizer("chatml", template).apply_chat_template(msgs, tokenize=False)


def test_a_tokenizer_files_padding_never_reaches_a_chat_batch(
        tmp_path: Path, handle: TokenizerHandle) -> None:
    # the chat kind tokenizes whole map tasks at once (and copies the tokenizer when it drops
    # the post-processor): a file's padding would pad each conversation to the longest
    tok = Tokenizer.from_file(TOKENIZER)
    tok.enable_padding(pad_id=0, pad_token=tok.id_to_token(0))
    path = tmp_path / "tokenizer.json"
    path.write_text(tok.to_str())
    padded = TokenizerHandle.load(TokenizerSpec(uri=str(path)))
    convs = [CONVERSATIONS["ends_with_user"], CONVERSATIONS["multi_turn"]]
    for train_on in ("assistant", "all"):
        plain_kind = config_kind(handle, "chatml", train_on=train_on)
        padded_kind = config_kind(padded, "chatml", train_on=train_on)
        want = [one(plain_kind, c) for c in convs]
        docs = [padded_kind.render(c)[0] for c in convs]
        columns, offsets, _ = padded_kind.tokenize(docs)
        got = [(columns["input_ids"][offsets[i]:offsets[i + 1]].tolist(),
                columns["loss_mask"][offsets[i]:offsets[i + 1]].tolist()) for i in range(2)]
        assert got == want, f"train_on {train_on}: a batch must give each alone's ids and mask"
