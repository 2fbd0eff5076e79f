"""Hostile chat templates: each stops quickly with a bad record, or is refused at load.

A chat template is data, so it must be bounded like data (datalane's template sandbox,
``datalane.engine.documents.template_sandbox``). The templates here are the kinds an
independent tester found getting past Jinja's sandbox: ones that hang a lane's worker thread
(a 10^10-iteration loop), ones that take all memory (``'a' * 10**10``, a string doubled in a
loop, a ``join`` of a list repeated 10^5 times), and ones that render differently on two runs
(an object printed with its address, ``map('random')``, a set's order). Each must end as a
bad record of reason ``chat_template`` naming the bound (in well under the test's own
deadline), or as a ConfigError when the template is loaded. Every conversation below is a
real ``ChatKind`` render with the demo tokenizer; the numbers in the messages are the
documented bounds.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from datalane.engine.documents import template_budget
from datalane.engine.documents.chat import ChatKind
from datalane.engine.tokenize import TokenizerHandle
from datalane.spec import ConfigError, model
from datalane.spec.chat import ChatSpec
from datalane.spec.recipe import TokenizerSpec
from tests.support import paths
from tests.support.deadline import deadline

TOKENIZER = str(paths.DATA / "chat" / "tokenizer.json")
CONVERSATION = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
# each hostile part is rendered after a normal ChatML-like turn list, so that the record
# would otherwise be a good one
TURNS = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def handle() -> TokenizerHandle:
    return TokenizerHandle.load(TokenizerSpec(uri=TOKENIZER))


def kind(handle: TokenizerHandle, template: str) -> ChatKind:
    spec = model.load(ChatSpec, {"template_text": template}, "sources[0].chat")
    return ChatKind(spec, handle, "sources[0].chat")


def bad_record(handle: TokenizerHandle, template: str, seconds: float = 20,
               conversation: list[dict[str, Any]] = CONVERSATION) -> tuple[str, float]:
    """The detail of the bad record ``template`` makes of ``conversation``, and the time."""
    k = kind(handle, template)
    start = time.perf_counter()
    with deadline(seconds):
        doc, reason, detail = k.render(conversation)
    took = time.perf_counter() - start
    assert (doc, reason) == (None, "chat_template"), detail
    assert reason in k.bad_reasons
    return str(detail), took


STEPS = "TemplateLimitError: the template took more than 1,048,576 steps"
HANGS = {
    "nested loops, 10^10 iterations":
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "nested loops writing into a set block":
        "{% set x %}{% for i in range(100000) %}{% for j in range(100000) %}0123456789"
        "{% endfor %}{% endfor %}{% endset %}{{ x | length }}",
    "'in' over a 60 MB string in a loop":
        "{% set big = 'a' * 60000000 %}{% for i in range(100000) %}{% for j in range(100) %}"
        "{% if 'b' in big %}{% endif %}{% endfor %}{% endfor %}",
    "a recursive macro": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "a recursive loop": "{% for x in [[1]] recursive %}{{ loop([[x]]) }}{% endfor %}",
}
HANG_DETAILS = {"a recursive macro": "TemplateLimitError: the template nests more than 64 calls",
                "a recursive loop": "TemplateLimitError: the template nests more than 64 calls"}


@pytest.mark.parametrize("case", sorted(HANGS))
def test_a_template_that_would_hang_stops_at_its_bound(handle: TokenizerHandle,
                                                      case: str) -> None:
    detail, took = bad_record(handle, TURNS + HANGS[case])
    assert detail.startswith("the chat template failed on messages[:2]: ")
    assert HANG_DETAILS.get(case, STEPS) in detail
    assert took < 15, took


def chars(n: int) -> str:
    return (f"TemplateLimitError: the template would make a string of {n:,} characters, "
            f"more than 67,108,864")


def items(n: int) -> str:
    return f"TemplateLimitError: the template would make {n:,} items, more than 1,048,576"


INT_BITS = "TemplateLimitError: the template would make an integer of more than 65,536 bits"
BLOWUPS = {
    "'a' * 10**10": ("{{ 'a' * 10**10 }}", chars(10**10)),
    "a list times 10**9": ("{{ ([1] * 10**9) | length }}", items(10**9)),
    "a string doubled with ~": (
        "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}{{ ns.s | length }}", chars(2**27)),
    "a string doubled with +": (
        "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}"
        "{% endfor %}{{ ns.s | length }}", chars(2**27)),
    "join of a list repeated 10^5 times": (
        "{{ ([range(100000) | list] * 100000) | join }}", STEPS),
    "center(10**10)": ("{{ 'a' | center(10**10) }}", chars(10**10)),
    "str.ljust(10**10)": ("{{ 'a'.ljust(10000000000) }}", chars(10**10)),
    "a %-format width": ("{{ '%10000000000s' | format('a') }}", chars(10**10 + 45)),
    "a str.format width": ("{{ '{:>10000000000}'.format('a') }}", chars(10**10)),
    "2 ** 10**10": ("{{ 2 ** (10 ** 10) }}", INT_BITS),
    "an integer squared in a loop": (
        "{% set ns = namespace(n=3) %}{% for i in range(40) %}{% set ns.n = ns.n * ns.n %}"
        "{% endfor %}{{ ns.n > 1 }}", INT_BITS),
    "replace doubling a string": (
        "{% set ns = namespace(s='x' * 1000) %}{% for i in range(30) %}"
        "{% set ns.s = ns.s | replace('x', 'xx') %}{% endfor %}{{ ns.s | length }}",
        chars(1000 * 2**17)),
    "indent of 10^5 lines by 10^5": ("{{ ('\\n' * 100000) | indent(100000) }}",
                                     chars(10**5 + 100001 * 10**5)),
    "batch filled to 10^9": ("{{ [1] | batch(10**9, 0) | list | length }}", items(10**9)),
    "int.to_bytes(10**10)": ("{{ (1).to_bytes(10000000000, 'big') }}", chars(10**10)),
    "100 MB of output": ("{% for i in range(100) %}{{ 'a' * 1000000 }}{% endfor %}",
                         "TemplateLimitError: the template's output passed 67,108,864 "
                         "characters"),
    "100 MB in a set block": ("{% set x %}{% for i in range(100) %}{{ 'a' * 1000000 }}"
                              "{% endfor %}{% endset %}{{ x | length }}", chars(68_000_000)),
}


@pytest.mark.parametrize("case", sorted(BLOWUPS))
def test_a_template_that_would_take_all_memory_is_refused_before_it_does(
        handle: TokenizerHandle, case: str) -> None:
    template, expected = BLOWUPS[case]
    detail, took = bad_record(handle, TURNS + template)
    assert expected in detail, detail
    assert took < 15, took


def test_a_conversation_whose_text_passes_the_output_bound_is_a_bad_record(
        handle: TokenizerHandle) -> None:
    big = [{"role": "user", "content": "x" * (64 << 20)}, {"role": "assistant", "content": "y"}]
    detail, _ = bad_record(handle, TURNS, conversation=big)
    assert "TemplateLimitError: the template's output passed 67,108,864 characters" in detail


def test_the_wall_clock_bound_stops_slow_steps(handle: TokenizerHandle,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Comparing two 60 MB strings is one step that takes milliseconds: 100,000 of them are
    within the step bound, and the clock stops them (here at 0.5 s instead of 10 s)."""
    monkeypatch.setattr(template_budget, "RENDER_SECONDS", 0.5)
    detail, took = bad_record(handle, TURNS + (
        "{% set a = 'a' * 60000000 %}{% set b = 'a' * 59999999 ~ 'b' %}"
        "{% for i in range(100000) %}{% if a == b %}{% endif %}{% endfor %}"))
    assert "TemplateLimitError: the template ran for more than 0.5 s" in detail
    assert took < 10, took


NONDETERMINISTIC = "NondeterministicOutput: the template prints a {}, whose text is not the " \
                   "same on every run"
PRINTS = {
    "{{ cycler(1, 2) }}": "Cycler",
    "{{ joiner() }}": "Joiner",
    "{{ namespace() }}": "_TemplateNamespace",
    "{{ range }}": "function",
    "{{ 'x'.upper }}": "builtin_function_or_method",
    "{{ messages | map(attribute='role') }}": "generator",
    "{{ messages | selectattr('role') }}": "generator",
    "{{ cycler(1) | string }}": "Cycler",
    "{{ 'x' ~ joiner() }}": "Joiner",
    "{{ '%s' % range }}": "function",
    "{{ '{}'.format(cycler(1)) }}": "Cycler",
    "{{ [cycler(1)] | join }}": "Cycler",
    "{{ joiner() | upper }}": "Joiner",
    "{{ [messages | map(attribute='role')] }}": "generator",
    "{{ raise_exception | pprint }}": "function",
}


@pytest.mark.parametrize("template", sorted(PRINTS))
def test_a_value_without_a_fixed_text_is_never_printed(handle: TokenizerHandle,
                                                       template: str) -> None:
    detail, _ = bad_record(handle, TURNS + template)
    assert NONDETERMINISTIC.format(PRINTS[template]) in detail, detail


def test_a_set_has_no_order_and_is_refused(handle: TokenizerHandle) -> None:
    detail, _ = bad_record(handle, TURNS + "{% for k in messages[0].keys() - ['x'] %}{{ k }}"
                                           "{% endfor %}")
    assert "NondeterministicOutput: the template made a set, whose order differs between " \
           "runs" in detail


LOAD_REFUSALS = {
    "{{ messages | map('random') | list }}":
        "uses the 'random' filter through map (line 1)",
    "{% set f = 'random' %}{{ messages | map(f) | list }}":
        "names the filter of map with an expression (line 1)",
    "{{ messages | select(*['defined']) | list }}":
        "passes *args or **kwargs to select (line 1)",
    "{% set t = 'defined' %}{{ messages | selectattr('role', t) | list }}":
        "names the test of selectattr with an expression (line 1)",
    "{{ messages | reject(messages[0].role) | list }}":
        "names the test of reject with an expression (line 1)",
    "{{ 'x' * 10 }}" * 80_000: "is 1,120,000 characters long; a chat template may have at "
                                "most 1,048,576",
    "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}": "is nested too deeply to compile",
    "".join(f"{{% for i{i} in [1] %}}" for i in range(30)) + "x" + "{% endfor %}" * 30:
        "is nested too deeply to compile",
}


@pytest.mark.parametrize("template", sorted(LOAD_REFUSALS))
def test_a_template_that_could_differ_between_runs_is_refused_at_load(
        handle: TokenizerHandle, template: str) -> None:
    with pytest.raises(ConfigError) as info:
        kind(handle, template)
    assert str(info.value).startswith("sources[0].chat.template_text ")
    assert LOAD_REFUSALS[template] in str(info.value)
