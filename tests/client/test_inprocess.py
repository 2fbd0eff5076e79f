"""``InProcessLoader`` has the interface docs/client.md gives it: a context manager, as
``SidecarLoader`` is (the docs said "the same interface", and ``with
InProcessLoader(...)`` raised)."""

from __future__ import annotations

from datalane.client import InProcessLoader


def test_in_process_loader_is_a_context_manager(make_recipe) -> None:
    recipe = make_recipe()  # 8 lanes, B=16: rank 1 of 2 owns lanes 4-7, 8 sequences a step
    with InProcessLoader(recipe, 1, 2, 4) as loader:
        assert loader.per_step == 2 and list(loader.lanes) == [4, 5, 6, 7]
        got = [(b.step, b.index, b.input_ids.shape) for _, b in zip(range(3), loader,
                                                                      strict=False)]
    assert got == [(0, 0, (4, 129)), (0, 1, (4, 129)), (1, 0, (4, 129))]
    assert loader._loader._streams is None  # the engine's streams were closed on exit
