"""DataLaneDataset inside a torch DataLoader: what works, and the misuse that is refused at
the first item (never a silent duplicate or a stacked batch)."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

from datalane import ConfigError
from datalane.client import InProcessLoader
from datalane.client.torch import DataLaneDataset


def _ids(items) -> list[bytes]:
    return [mb["input_ids"].numpy().tobytes() for mb in items]


def test_batch_size_none_yields_the_stream_in_order(make_recipe) -> None:
    recipe = make_recipe()
    direct = iter(DataLaneDataset(InProcessLoader(recipe, 0, 2, 4)))
    expected = _ids(next(direct) for _ in range(3))
    it = iter(DataLoader(DataLaneDataset(InProcessLoader(recipe, 0, 2, 4)), batch_size=None))
    got = [next(it) for _ in range(3)]
    assert _ids(got) == expected
    assert got[0]["input_ids"].shape == (4, recipe.seq_len)


# DataLoader workers fork on purpose; Lance (imported by other tests of the run) warns at every fork
@pytest.mark.filterwarnings("ignore:lance is not fork-safe:UserWarning")
def test_workers_are_refused_instead_of_yielding_each_microbatch_twice(make_recipe) -> None:
    ds = DataLaneDataset(InProcessLoader(make_recipe(), 0, 1, 4))
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    with pytest.raises(Exception, match=r"DataLoader worker \d of 2: every worker would yield "
                                        r"the whole stream .* num_workers=0"):
        next(iter(loader))


@pytest.mark.parametrize("size", [1, 3])
def test_a_batch_size_is_refused_before_anything_is_stacked(make_recipe, size) -> None:
    inner = InProcessLoader(make_recipe(), 0, 1, 4)
    ds = DataLaneDataset(inner)
    with pytest.raises(ConfigError, match=rf"batch_size={size} would stack {size} of them .* "
                                          r"DataLoader\(dataset, batch_size=None\)"):
        next(iter(DataLoader(ds, batch_size=size)))
    assert inner.state_dict()["consumed"] == 0  # nothing was taken from the stream


def test_every_iter_continues_at_the_position(make_recipe) -> None:
    """A DataLoader is iterated again every epoch: the stream goes on, nothing repeats."""
    recipe = make_recipe()
    whole = iter(DataLaneDataset(InProcessLoader(recipe, 1, 2, 2)))
    expected = _ids(next(whole) for _ in range(9))
    ds = DataLaneDataset(InProcessLoader(recipe, 1, 2, 2))
    dl = DataLoader(ds, batch_size=None)
    got: list[bytes] = []
    for take in (3, 1, 5):  # stops inside steps (4 microbatches per step)
        it = iter(dl)
        got += _ids(next(it) for _ in range(take))
    assert got == expected


def test_a_retired_iterator_is_refused(make_recipe) -> None:
    recipe = make_recipe()
    whole = iter(DataLaneDataset(InProcessLoader(recipe, 0, 1, 4)))
    expected = _ids(next(whole) for _ in range(3))
    ds = DataLaneDataset(InProcessLoader(recipe, 0, 1, 4))
    first = iter(ds)
    got = _ids([next(first)])
    second = iter(ds)
    got += _ids([next(second)])
    with pytest.raises(ConfigError, match="retired"):
        next(first)
    got += _ids([next(second)])
    assert got == expected
