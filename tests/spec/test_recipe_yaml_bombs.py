"""Recipe and state files that cost far more to load than their size: refused, quickly.

A YAML alias (``*name``) repeats a node, so ten lines of nested aliases ("billion laughs",
843 bytes) stand for 10^10 strings; any walk over the loaded value (the depth check,
the recipe model) expands them. The loader refuses an alias while the document is composed,
before anything is built, with a ConfigError naming the file and the line. An integer of more
than 4,300 digits (Python's limit on converting one) is a ConfigError naming the file, not a
raw ValueError, in YAML and in JSON.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from datalane.spec.errors import ConfigError, MismatchError
from datalane.spec.integrity import read_json_file
from datalane.spec.recipe import load_recipe
from tests.support.deadline import deadline

LAUGHS = ["lol0: &lol0 [" + ", ".join(['"lol"'] * 10) + "]"] + [
    f"lol{i}: &lol{i} [" + ", ".join([f"*lol{i - 1}"] * 10) + "]" for i in range(1, 10)]
BOMB = "\n".join(LAUGHS) + "\nlanes: *lol9\n"  # 10^10 strings in 843 bytes


def test_a_billion_laughs_recipe_is_refused_before_it_expands(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    assert path.stat().st_size < 1024
    start = time.perf_counter()
    with deadline(5), pytest.raises(ConfigError) as info:
        load_recipe(path)
    took = time.perf_counter() - start
    assert str(info.value) == (
        f"recipe {path} line 2: the YAML alias *lol0 repeats another node; recipes may not use "
        f"anchors and aliases (&name, *name, <<: *name), write the values out")
    assert took < 1.0, took


def test_a_merge_key_is_an_alias_too(tmp_path: Path) -> None:
    path = tmp_path / "merge.yaml"
    path.write_text("base: &base {lanes: 1}\nrecipe:\n  <<: *base\n  seq_len: 8\n")
    with pytest.raises(ConfigError, match=rf"recipe {path} line 3: the YAML alias \*base"):
        load_recipe(path)


def test_an_anchor_alone_expands_nothing_and_loads(tmp_path: Path) -> None:
    path = tmp_path / "anchor.yaml"
    path.write_text("lanes: &n 1\nglobal_batch_size: 1\nseq_len: 8\n"
                    "tokenizer: {uri: tok.json}\nsources: [{name: a, uris: [a.jsonl]}]\n")
    assert load_recipe(path).lanes == 1


def test_an_integer_too_long_to_convert_is_a_config_error(tmp_path: Path) -> None:
    digits = "1" * 5000
    yaml_path = tmp_path / "r.yaml"
    yaml_path.write_text(f"lanes: {digits}\n")
    with pytest.raises(ConfigError, match=rf"recipe {yaml_path} holds a value YAML cannot "
                                          r"read: Exceeds the limit \(4300 digits\)"):
        load_recipe(yaml_path)
    json_path = tmp_path / "r.json"
    json_path.write_text(f'{{"lanes": {digits}}}')
    with pytest.raises(ConfigError, match=rf"recipe {json_path} is not valid JSON: Exceeds "
                                          r"the limit \(4300 digits\)"):
        load_recipe(json_path)
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"step": 1})[:-1] + f', "n": {digits}}}')
    with pytest.raises(MismatchError, match=rf"state file {state} is not valid JSON: Exceeds"):
        read_json_file(str(state), "state file", MismatchError)


@pytest.mark.parametrize(("name", "text", "where", "key"), [
    ("r.json", '{"lanes": 1, "lanes": 2}', "", "lanes"),
    ("r.yaml", "lanes: 2\nsources:\n  - name: a\n    uris: [a]\n    name: b\n", " line 5",
     "name"),
])
def test_a_duplicate_key_is_still_named_as_such(tmp_path: Path, name: str, text: str,
                                                 where: str, key: str) -> None:
    """JSON names the file, YAML the line of the second key too."""
    path = tmp_path / name
    assert _refusal(path, text) == (
        f"recipe {path}{where}: the key {key!r} appears twice in one mapping")


def _refusal(path: Path, text: str) -> str:
    """The ConfigError of loading ``text`` written to ``path``."""
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    return str(info.value)


def test_an_empty_or_null_recipe_file_is_named_empty(tmp_path: Path) -> None:
    for name, text in (("e.yaml", ""), ("c.yaml", "# only a comment\n"), ("n.yaml", "null\n"),
                       ("n.json", "null")):
        assert _refusal(tmp_path / name, text) == f"recipe {tmp_path / name} is empty"


def test_a_json_recipe_is_read_as_json_and_a_yaml_one_as_yaml(tmp_path: Path) -> None:
    """A ``.json`` file is JSON (a YAML-only spelling is an error); any other is YAML."""
    text = "lanes: 1\nglobal_batch_size: 1\nseq_len: 8\ntokenizer: {uri: /t.json}\n" \
           "sources: [{name: a, uris: [/a.jsonl]}]\n"
    as_yaml = tmp_path / "r.yml"
    as_yaml.write_text(text)
    assert load_recipe(as_yaml).seq_len == 8
    as_json = tmp_path / "r.json"
    assert _refusal(as_json, text).startswith(f"recipe {as_json} is not valid JSON: ")
