"""Shared fixtures: a small real corpus (Parquet + JSONL + a real BPE tokenizer) and recipes.

The corpus comes from :func:`datalane.corpus.make_corpus`, deterministic for its arguments,
so golden hashes stay valid across machines.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from datalane.corpus import DemoCorpus, make_corpus
from datalane.spec.recipe import Recipe, load_recipe

pytest_plugins = ["tests.support.s3server", "tests.cluster.plugin"]

# Property tests check behaviour, not speed: on a busy 2-core machine one example can take
# longer than hypothesis' default 200 ms deadline, which would fail a correct test.
settings.register_profile("datalane", deadline=None)
settings.load_profile("datalane")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that runs the images (the ``container_images`` fixture) is in the ``containers``
    tier, as one using ``k8s_cluster`` is in ``cluster`` (tests/cluster/plugin.py)."""
    for item in items:
        if "container_images" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.containers)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> DemoCorpus:
    """600 short web documents in 4 Parquet files and 30 long code documents in 2 JSONL."""
    return make_corpus(str(tmp_path_factory.mktemp("corpus")), web_docs=600)


def base_recipe_dict(c: DemoCorpus, **overrides: Any) -> dict[str, Any]:
    """A two-source recipe over the test corpus; ``overrides`` replace top-level keys."""
    data: dict[str, Any] = {
        "lanes": 8,
        "global_batch_size": 16,
        "seq_len": 128,
        "seed": 5,
        "tokenizer": {"uri": c.tokenizer},
        "sources": [
            {"name": "web", "uris": [c.web], "weight": 0.7, "epochs": 1, "chunk_rows": 50},
            {"name": "code", "uris": [c.code], "weight": 0.3, "epochs": 1,
             "chunk_bytes": 8192},
        ],
        "shuffle": {"block_size": 16},
    }
    data.update(copy.deepcopy(overrides))
    return data


@pytest.fixture
def make_recipe(corpus: DemoCorpus) -> Callable[..., Recipe]:
    """``make_recipe(**overrides)`` -> a validated :class:`Recipe` over the test corpus."""

    def build(**overrides: Any) -> Recipe:
        return load_recipe(base_recipe_dict(corpus, **overrides))

    return build


@pytest.fixture
def write_recipe(corpus: DemoCorpus, tmp_path: Path) -> Callable[..., str]:
    """``write_recipe(**overrides)`` -> path of a YAML recipe file over the test corpus."""
    import yaml

    def write(**overrides: Any) -> str:
        path = tmp_path / f"recipe-{len(list(tmp_path.glob('recipe-*')))}.yaml"
        path.write_text(yaml.safe_dump(base_recipe_dict(corpus, **overrides)))
        return str(path)

    return write
