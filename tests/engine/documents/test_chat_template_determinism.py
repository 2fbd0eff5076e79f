"""Every chat template renders the same bytes in two Python processes, or fails the same way.

A step hash covers the rendered conversations, so a template must render identically on
every run: no object addresses (``{{ cycler('a') }}``), no set order (which follows
``PYTHONHASHSEED``), no randomness. The templates are the shipped ones and ones hypothesis
builds (seeded, a small fixed budget) from a grammar of constructs chat templates use, plus a
few that would print an address or a set; each is rendered on a few conversations in two
processes with different ``PYTHONHASHSEED`` values, and the results (the text, or the
error's type and message) must be equal byte for byte. Those that render must also render
as ``transformers``' ``apply_chat_template`` does.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerFast

from tests.support import paths

ROOT = paths.REPO
DATA = paths.DATA / "chat"
SHIPPED = [json.loads((DATA / "chatml" / "tokenizer_config.json").read_text())["chat_template"],
           (DATA / "llama3" / "chat_template.jinja").read_text(),
           (DATA / "chatml_generation.jinja").read_text()]
CONVERSATIONS = [
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Grüße 🙂 "},
     {"role": "assistant", "content": "東京\n"}, {"role": "user", "content": "again"},
     {"role": "assistant", "content": "", "name": "bot"}],
]
SPECIAL = {"bos_token": "<|bos|>", "eos_token": "<|eos|>"}

TOP = [
    "{{ messages | length }}",
    "{{ messages | map(attribute='role') | join(', ') }}",
    "{{ messages | tojson }}",
    "{{ messages[0] }}",
    "{{ messages[0].keys() | list }}",
    "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}",
    "{{ messages | groupby('role') | map(attribute='grouper') | join('/') }}",
    "{{ messages | map(attribute='content') | unique | list }}",
    "{{ (messages | sort(attribute='content') | first).content }}",
    "{{ messages[0] | dictsort }}",
    "{{ messages[0] | items | list }}",
    "{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.current }}",
    "{% set j = joiner('; ') %}{% for m in messages %}{{ j() }}{{ m.role }}{% endfor %}",
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m.content "
    "| length %}{% endfor %}{{ ns.n }}",
    "{{ '%s=%d' % ('n', messages | length) }}",
    "{{ '{}:{}'.format(messages[0].role, 1.5) }}",
    "{{ {'a': 1, 'b': [1, 2.5, none, true]} }}",
    "{{ range(3) | list }}",
    "{{ dict(x=1, y='z') | tojson(sort_keys=true) }}",
    "{{ messages[0].content | upper | center(20) }}",
    "{{ messages | map(attribute='content') | map('trim') | join('|') }}",
    "{{ messages | map(attribute='content') | map('upper') | join }}",
    "{{ messages | map('string') | list | length }}",
    "{{ messages | rejectattr('role', 'in', ['system']) | map(attribute='role') | list }}",
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "{{ bos_token ~ eos_token }}",
    # each of these would print an address or a set's order
    "{{ cycler('a') }}",
    "{{ joiner() }}",
    "{{ messages | map(attribute='role') }}",
    "{% for k in messages[0].keys() - ['x'] %}{{ k }}{% endfor %}",
    "{{ 'x'.upper }}",
]
BODY = [
    "{{ m.role }}", "{{ m.content | trim }}", "{{ loop.index }}",
    "{% if loop.first %}F{% endif %}", "{% if loop.last %}L{% endif %}",
    "{{ loop.cycle('x', 'y') }}", "{{ loop.length }}", "{{ m | tojson }}",
    "{{ m.content ~ '!' }}", "{{ m['content'] + '?' }}",
    "{% if m.role == 'user' %}U{% else %}A{% endif %}", "{{ m.keys() | list }}",
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n",
]
loops = st.lists(st.sampled_from(BODY), min_size=1, max_size=4).map(
    lambda body: "{% for m in messages %}" + "".join(body) + "{% endfor %}")
templates = st.lists(st.one_of(st.sampled_from(TOP), loops), min_size=1, max_size=5).map(
    "".join)

RENDER = """
import json, sys
from datetime import datetime
from datalane.engine.documents.chat_template import ChatTemplate, TemplateSource, plain_message
cases = json.load(open(sys.argv[1]))
out = []
for text in cases["templates"]:
    try:
        t = ChatTemplate(TemplateSource(text, "t", cases["special"]), datetime(2024, 7, 26))
    except Exception as e:
        out.append(f"! load {type(e).__name__}: {e}")
        continue
    for conv in cases["conversations"]:
        msgs = [plain_message(m) for m in conv]
        for prompt in (False, True):
            try:
                out.append(t.render(msgs, prompt))
            except Exception as e:
                out.append(f"! render {type(e).__name__}: {e}")
sys.stdout.write(json.dumps(out))
"""


def render_in_a_process(cases: Path, hash_seed: int) -> list[str]:
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", RENDER, str(cases)], env=env, check=True,
                          capture_output=True, timeout=300)
    rendered: list[str] = json.loads(done.stdout)
    return rendered


def transformers_render(text: str, conv: list[dict[str, Any]], prompt: bool) -> str:
    rendered: str = _transformers().apply_chat_template(
        conv, chat_template=text, tokenize=False, add_generation_prompt=prompt)
    return rendered


@functools.cache
def _transformers() -> Any:
    return PreTrainedTokenizerFast(tokenizer_file=str(DATA / "tokenizer.json"), **SPECIAL)


@settings(max_examples=2, derandomize=True, database=None)
@given(st.lists(templates, min_size=24, max_size=24))
def test_two_processes_render_the_same_bytes(generated: list[str]) -> None:
    import tempfile

    texts = SHIPPED + generated
    with tempfile.TemporaryDirectory() as folder:
        cases = Path(folder) / "cases.json"
        cases.write_text(json.dumps({"templates": texts, "conversations": CONVERSATIONS,
                                     "special": SPECIAL}))
        first = render_in_a_process(cases, 1)
        second = render_in_a_process(cases, 2)
    assert first == second
    per_template = 2 * len(CONVERSATIONS)
    rendered = 0
    position = 0
    for text in texts:
        if first[position].startswith("! load "):
            position += 1
            continue
        for conv in CONVERSATIONS:
            for prompt in (False, True):
                got = first[position]
                position += 1
                if not got.startswith("! render "):
                    assert got == transformers_render(text, conv, prompt), text
                    rendered += 1
    assert position == len(first)
    print(f"{len(texts)} templates: {rendered} of {len(first)} renders gave text")
    assert rendered >= per_template * len(SHIPPED)  # the shipped ones render, and others
