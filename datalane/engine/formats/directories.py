"""Dataset directories: what a source URI naming a directory reads.

Some formats keep a dataset in a directory rather than in files a glob names: an MDS dataset
(``index.json`` lists its shards), a Hugging Face ``save_to_disk`` directory (``state.json``
lists its Arrow files), a Lance dataset (a ``_versions`` directory; the dataset is one source
file). Their declarations (:data:`datalane.spec.formats.DECLARED`, ``directory=``) say which
and in what order an inferred directory is tried; each implements
:meth:`~datalane.engine.formats.base.Format.list_directory`. :func:`directory_lister` gives
:func:`datalane.engine.files.expand` the lister for a source: the declared format's, or, when
the format is inferred, each of them in turn (the first that recognises the directory). A
directory is recognised by what it holds, never by its name; a listed entry that is itself a
dataset directory (a Lance table, whose name may have no ``.lance``) has its format from
:func:`listed_format`, since no extension names it.
"""

from __future__ import annotations

from typing import Any

from datalane.engine.files import DirectoryLister
from datalane.engine.formats import FORMATS
from datalane.spec.formats import directory_formats

__all__ = ["LISTERS", "directory_lister", "listed_format"]

#: format name -> lister of its dataset directories, in the order an inferred one is tried
LISTERS: dict[str, DirectoryLister] = {
    spec.name: FORMATS[spec.name].list_directory for spec in directory_formats()}


def directory_lister(declared: str | None) -> DirectoryLister | None:
    """The lister for a source whose format is ``declared`` (None: inferred)."""
    if declared is not None:
        return LISTERS.get(declared)

    def any_dataset(fs: Any, path: str) -> list[tuple[str, int, str]] | None:
        for lister in LISTERS.values():
            listed = lister(fs, path)
            if listed is not None:
                return listed
        return None

    return any_dataset


def listed_format(ident: str) -> str | None:
    """The format of a listed entry whose identity says it is a dataset directory (a Lance
    table: ``lance-version=N``), or None (a file: its extension names its format)."""
    return next((name for name, fmt in FORMATS.items() if fmt.lists(ident)), None)
