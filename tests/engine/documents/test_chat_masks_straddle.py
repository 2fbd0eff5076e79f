"""Loss masks on tokens that straddle the edge of a trained span, as transformers marks them.

transformers' ``return_assistant_tokens_mask`` maps each ``{% generation %}`` span's first and
last character to tokens with ``char_to_token`` and marks every token between them: a token
holding the header's last character and the content's first (ChatML's ``"\\n"`` and a leading
space, ``"ĊĠ"``) is trained, and so is one across the span's end; of a character split into
several byte tokens, ``char_to_token`` names the first, so at a span's end only that one is.
The demo tokenizer has no merges across whitespace, so these tests use it with seven more
(``ĊĠ``, ``ĊĊ``, ``ĠĠ``, ``ĊĊĊ``, ``é``, ``Ġé``, ``ðŁ``, as real byte-level BPE vocabularies
have), written to a real tokenizer.json. Each hand-worked mask is also checked against
transformers on a ``{% generation %}`` version of the same template, and a seeded set of
generated conversations must get transformers' masks token for token.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from transformers import PreTrainedTokenizerFast

from datalane.engine.documents.chat import ChatKind
from datalane.engine.tokenize import TokenizerHandle
from datalane.spec import model
from datalane.spec.chat import ChatSpec
from datalane.spec.recipe import TokenizerSpec
from tests.engine.documents.test_chat import trimming_tokenizer
from tests.support import paths

DATA = paths.DATA / "chat"
MERGES = [("Ċ", "Ġ"), ("Ċ", "Ċ"), ("Ġ", "Ġ"), ("ĊĊ", "Ċ"), ("Ã", "©"), ("Ġ", "Ã©"),
          ("ð", "Ł")]

# ChatML with the assistant's content and end-of-turn marked for transformers; datalane
# renders {% generation %} as its body and finds the same spans from the prefix renders
CHATML = ("{% for m in messages %}{% if m.role == 'assistant' %}<|im_start|>assistant\n"
          "{% generation %}{{ m.content }}<|im_end|>\n{% endgeneration %}"
          "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# "Q: x\nA: y\n": the generation prompt "A: " ends with a space
QA = ("{% for m in messages %}{% if m.role == 'user' %}Q: {{ m.content }}\n{% else %}"
      "A: {% generation %}{{ m.content }}\n{% endgeneration %}{% endif %}{% endfor %}"
      "{% if add_generation_prompt %}A: {% endif %}")
# the messages' contents back to back: a span is exactly an assistant's content
BARE = ("{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
        "{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}")


def U(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def A(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def write_merged_tokenizer(folder: Path) -> str:
    """tests/data/chat/tokenizer.json with MERGES added, written to ``folder``: the new tokens
    take the ids after the vocabulary, the special tokens added after it move up by as
    many."""
    config = json.loads((DATA / "tokenizer.json").read_text())
    vocab = config["model"]["vocab"]
    next_id = len(vocab)
    for token in config["added_tokens"]:
        if token["id"] >= next_id:
            token["id"] += len(MERGES)
    for left, right in MERGES:
        vocab[left + right] = next_id
        next_id += 1
        config["model"]["merges"].append([left, right])
    path = folder / "tokenizer.json"
    path.write_text(json.dumps(config, ensure_ascii=False))
    return str(path)


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_merged_tokenizer(tmp_path_factory.mktemp("merged"))


@pytest.fixture(scope="module")
def handle(tokenizer_file: str) -> TokenizerHandle:
    return TokenizerHandle.load(TokenizerSpec(uri=tokenizer_file))


def datalane_mask(handle: TokenizerHandle, template: str, msgs: list[dict[str, str]],
                  **spec: Any) -> list[tuple[str, int]]:
    k = ChatKind(model.load(ChatSpec, {"template_text": template, **spec}, "chat"), handle)
    doc, reason, detail = k.render(msgs)
    assert doc is not None, (reason, detail)
    cols, _, _ = k.tokenize([doc])
    tokens = [handle.tokenizer.id_to_token(int(i)) for i in cols["input_ids"]]
    return list(zip(tokens, cols["loss_mask"].tolist(), strict=True))


def transformers_mask(tokenizer_file: str, template: str,
                      msgs: list[dict[str, str]]) -> list[tuple[str, int]]:
    tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_file, chat_template=template,
                                  eos_token="<|im_end|>")
    out = tok.apply_chat_template(msgs, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True)
    tokens = tok.convert_ids_to_tokens(out["input_ids"])
    return list(zip(tokens, out["assistant_masks"], strict=True))


USER_HI = [("<|im_start|>", 0), ("u", 0), ("s", 0), ("er", 0), ("Ċ", 0), ("h", 0), ("i", 0),
           ("<|im_end|>", 0), ("Ċ", 0)]
HEADER = [("<|im_start|>", 0), ("a", 0), ("ss", 0), ("i", 0), ("st", 0), ("an", 0)]

CASES = {
    # "\n  yo": the header's newline and the first space are one token, "ĊĠ"
    "leading spaces": (CHATML, [U("hi"), A("  yo")], USER_HI + HEADER + [
        ("t", 0), ("ĊĠ", 1), ("Ġy", 1), ("o", 1), ("<|im_end|>", 1), ("Ċ", 1)]),
    # "\n\n yo": the header's newline and the content's, "ĊĊ"
    "leading newline": (CHATML, [U("hi"), A("\n yo")], USER_HI + HEADER + [
        ("t", 0), ("ĊĊ", 1), ("Ġy", 1), ("o", 1), ("<|im_end|>", 1), ("Ċ", 1)]),
    # "A: é!": the prompt's space and the two bytes of "é" are one token, "ĠÃ©"
    "multi-byte start": (QA, [U("x"), A("é!")], [
        ("Q", 0), (":", 0), ("Ġx", 0), ("Ċ", 0), ("A", 0), (":", 0), ("ĠÃ©", 1), ("!", 1),
        ("Ċ", 1)]),
    # "A: hello": the prompt's space and "h" are "Ġh" (the demo vocabulary's own merge)
    "space and letter": (QA, [U("x"), A("hello")], [
        ("Q", 0), (":", 0), ("Ġx", 0), ("Ċ", 0), ("A", 0), (":", 0), ("Ġh", 1), ("e", 1),
        ("ll", 1), ("o", 1), ("Ċ", 1)]),
    # "a" + "\n\n" + "\n b": "ĊĊĊ" starts in the span and ends after it
    "across the end": (BARE, [U("a"), A("\n\n"), U("\n b")], [
        ("a", 0), ("ĊĊĊ", 1), ("Ġb", 0)]),
    # "a\n" + "\n" + "\n b": the span is the middle character of "ĊĊĊ"
    "inside one token": (BARE, [U("a\n"), A("\n"), U("\n b")], [
        ("a", 0), ("ĊĊĊ", 1), ("Ġb", 0)]),
    # "x" + "ab🙂" + "c": the span's last character is split into three byte tokens;
    # char_to_token names the first, so only "ðŁ" of them is trained
    "multi-byte end": (BARE, [U("x"), A("ab🙂"), U("c")], [
        ("x", 0), ("ab", 1), ("ðŁ", 1), ("Ļ", 0), ("Ĥ", 0), ("c", 0)]),
    # "🙂" + "d": a span starting on a split character starts at its first byte token
    "multi-byte first character": (BARE, [U("x"), A("🙂d"), U("c")], [
        ("x", 0), ("ðŁ", 1), ("Ļ", 1), ("Ĥ", 1), ("d", 1), ("c", 0)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hand_worked_masks_at_span_edges(handle: TokenizerHandle, tokenizer_file: str,
                                         case: str) -> None:
    template, msgs, expected = CASES[case]
    assert datalane_mask(handle, template, msgs) == expected
    assert transformers_mask(tokenizer_file, template, msgs) == expected


def test_last_assistant_trains_the_straddling_token_of_the_last_turn_only(
        handle: TokenizerHandle) -> None:
    got = datalane_mask(handle, CHATML, [U("hi"), A("  yo"), U("hi"), A("  yo")],
                        train_on="last_assistant")
    turn = HEADER + [("t", 0), ("ĊĠ", 1), ("Ġy", 1), ("o", 1), ("<|im_end|>", 1), ("Ċ", 1)]
    assert got == USER_HI + [(t, 0) for t, _ in turn] + USER_HI + turn


PIECES = [" ", "  ", "\n", "\n\n", " \n", "\t", "é", " é", "🙂", "Grüße", "東京", "hello",
          " world", "a", "42", "!", "<", "\u0041\u030a"]


def _content(rng: random.Random, least: int) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(least, 6)))


def conversations(seed: int, n: int) -> list[list[dict[str, str]]]:
    """``n`` conversations of 1 to 3 exchanges; an assistant's content is never empty (an
    empty {% generation %} span has no characters to map: transformers then marks a token
    across the empty span's place, or fails on a span at character 0)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        msgs = []
        for _ in range(rng.randint(1, 3)):
            msgs += [U(_content(rng, 0)), A(_content(rng, 1))]
        out.append(msgs)
    return out


@pytest.mark.parametrize("template", ["chatml", "bare"])
def test_generated_conversations_get_the_masks_of_transformers(
        handle: TokenizerHandle, tokenizer_file: str, template: str) -> None:
    text = {"chatml": (DATA / "chatml_generation.jinja").read_text(), "bare": BARE}[template]
    config = str(DATA / "chatml" / "tokenizer_config.json")
    tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_file, chat_template=text,
                                  eos_token="<|im_end|>")
    k = ChatKind(model.load(ChatSpec, {"template_text": text, "tokenizer_config": config},
                            "chat"), handle)
    straddling = 0
    for msgs in conversations(seed=23, n=64):
        doc, reason, detail = k.render(msgs)
        assert doc is not None, (reason, detail)
        out = tok.apply_chat_template(msgs, tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        cols, _, _ = k.tokenize([doc])
        assert cols["input_ids"].tolist() == out["input_ids"]
        assert cols["loss_mask"].tolist() == out["assistant_masks"], msgs
        enc = handle.tokenizer.encode(doc.text, add_special_tokens=False)
        straddling += sum(1 for s, e in doc.spans for a, b in enc.offsets if a < s < b)
    print(f"{straddling} tokens across a span's start")
    assert straddling >= 8  # the set does exercise them


def test_a_post_processor_that_trims_offsets_changes_no_mask(tokenizer_file: str,
                                                             tmp_path: Path) -> None:
    """A ByteLevel post-processor with trim_offsets reports "ĊĠ" as holding only the newline,
    so the span's first character (the space) would be in no token; datalane maps characters
    on the offsets before the post-processor trims them. (transformers maps them on the
    trimmed offsets: it finds no token for the span's start and marks nothing from that turn
    on.)"""
    trimming = trimming_tokenizer(tokenizer_file, tmp_path)
    enc = trimming.tokenizer.encode("t\n  yo", add_special_tokens=False)
    assert (enc.tokens[1], enc.offsets[1]) == ("ĊĠ", (1, 2))  # the premise: trimmed
    _, msgs, expected = CASES["leading spaces"]
    assert datalane_mask(trimming, CHATML, msgs) == expected
