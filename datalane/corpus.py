"""Moved to :mod:`datalane.testing`; this alias stays for one release (tests, bench and the
docs of datalane 0.1 import ``datalane.corpus``)."""

from datalane.testing import (
    CHATML_TEMPLATE,
    ChatCorpus,
    DemoCorpus,
    make_chat_corpus,
    make_corpus,
    tokenizer_path,
)

__all__ = ["CHATML_TEMPLATE", "ChatCorpus", "DemoCorpus", "make_chat_corpus", "make_corpus",
           "tokenizer_path"]
