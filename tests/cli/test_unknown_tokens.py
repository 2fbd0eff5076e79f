"""A valid tokenizer that maps a source's text to its unknown token is warned about: it
used to run silently, training on ``[UNK]`` after ``[UNK]``."""

from __future__ import annotations

import re
import subprocess
import sys

from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace


def _run(recipe: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "datalane.cli", "run", recipe, "--steps", "8",
                           "--world", "2"], capture_output=True, text=True, timeout=600)


def test_a_tokenizer_that_knows_none_of_the_words_is_warned_about(write_recipe,
                                                                  tmp_path) -> None:
    """A word-level vocabulary of the special tokens only: every word of the corpus is
    ``[UNK]`` (id 0), so 100% of each source's first 4,096 tokens are (EOS is added after the
    count). One warning per source, naming it, the share, the token and the tokenizer; the run
    itself goes on (exit 0)."""
    vocab = {"[UNK]": 0, "<|bos|>": 1, "<|eos|>": 2, "<|pad|>": 3}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    path = tmp_path / "words.json"
    tok.save(str(path))
    proc = _run(write_recipe(tokenizer={"uri": str(path)}))
    assert proc.returncode == 0, proc.stderr
    warned = re.findall(r"^source '(\w+)': (\d+) of its first (\d+) tokens \((\d+)%\) are the "
                        r"unknown token '\[UNK\]' \(id 0\): the tokenizer (\S+) does not cover "
                        r"this text; is it the right tokenizer.json for the data\?$",
                        proc.stderr, re.M)
    assert "web" in [w[0] for w in warned], proc.stderr
    assert len({w[0] for w in warned}) == len(warned)  # once per source
    for _, unknown, seen, share, uri in warned:
        assert unknown == seen and int(seen) >= 4096 and share == "100"
        assert uri == str(path)


def test_a_fitting_tokenizer_is_not_warned_about(write_recipe) -> None:
    proc = _run(write_recipe())
    assert proc.returncode == 0, proc.stderr
    assert "unknown token" not in proc.stderr


def test_a_tokenizer_handle_pickles_for_a_rank_worker(tmp_path) -> None:
    """A sidecar's rank worker gets the plans pickled: the handle travels without its lock and
    with no counts (a new process counts again), and encodes the same ids where it lands."""
    import pickle

    import numpy as np

    from datalane.engine.tokenize import TokenizerHandle
    from datalane.spec.recipe import TokenizerSpec
    from datalane.testing import tokenizer_path

    handle = TokenizerHandle.load(TokenizerSpec(uri=str(tokenizer_path())))
    handle._unknown["web"] = (8, 8)
    copy = pickle.loads(pickle.dumps(handle))
    assert copy._unknown == {} and handle._unknown == {"web": (8, 8)}
    assert copy._unknown_lock is not handle._unknown_lock
    copy.check_unknown(np.zeros(8, dtype=np.int32), "web")
    texts = ["the quick brown fox", "jumps over"]
    assert all(np.array_equal(a, b) for a, b in zip(copy.encode(texts), handle.encode(texts),
                                                    strict=True))
