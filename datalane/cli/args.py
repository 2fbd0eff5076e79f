"""Argument types and the parser class every ``datalane`` subcommand shares."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn

from datalane.spec.knobs import Knobs

__all__ = ["Parser", "Subcommands", "add_knobs", "ints", "knobs", "natural", "positive"]


def ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers") from None
    if not values:
        raise argparse.ArgumentTypeError("the list is empty")
    return values


def _at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is not at least {low}")
        return value

    parse.__name__ = "integer"  # what argparse calls the type in its messages
    return parse


positive = _at_least(1)
natural = _at_least(0)


class Parser(argparse.ArgumentParser):
    """Argument errors as one line naming the value (exit code 2), like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_knobs(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--workers", type=int, default=2, help="map worker threads")
    sp.add_argument("--prefetch", type=int, default=8, help="map tasks in flight per stream")


def knobs(args: argparse.Namespace, workers: int | None = None) -> Knobs:
    from datalane.spec import model

    return model.load(Knobs, {"workers": workers or args.workers, "prefetch": args.prefetch},
                      "knobs")


Subcommands = argparse._SubParsersAction  # what each command module's ``add`` adds itself to
