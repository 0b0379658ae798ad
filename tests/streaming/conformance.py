"""The resume-conformance check shared by every loader that saves positions.

A loader conforms when, for any point ``k``: take ``k`` items, save ``state_dict()``, build a
fresh loader, ``load_state_dict(state)``, and the fresh loader yields exactly the items the
uninterrupted one yields after ``k`` - at mid-epoch, at the end of the epoch (it then goes on
with the next epoch), and the epoch after is unaffected. States must be plain JSON-able values.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any, Protocol


class Stateful(Protocol):
    def __iter__(self) -> Any: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def assert_loader_resumes(
    make_loader: Callable[[], Any],
    key: Callable[[Any], Any] = lambda item: item,
    num_points: int = 2,
    seed: int = 0,
) -> None:
    """Check a loader's resume: mid-epoch, at the start, at the end, and the epoch after.

    The loader is iterated without ``set_epoch``: each pass must read the next epoch by
    itself. For a point ``k``: take ``k`` items of the first epoch, save ``state_dict()``, make
    a fresh loader, ``load_state_dict``; its passes must give the rest of the first epoch, then
    the whole second epoch, exactly as the uninterrupted loader did. A state saved at the end of
    an epoch resumes with the next epoch.

    Args:
        make_loader: Builds a fresh loader (and dataset) with the same settings.
        key: Turns an item into something comparable with ``==``.
        num_points: Random mid-epoch points to try, besides the start and the end.
        seed: Seed for choosing the points.
    """
    loader = make_loader()
    epochs = [[key(item) for item in loader] for _ in range(2)]
    assert epochs[0] and epochs[0] != epochs[1], "passes must move on to the next epoch"
    rng = random.Random(seed)
    points = {0, len(epochs[0]), *(rng.randrange(1, len(epochs[0])) for _ in range(num_points))}
    for point in sorted(points):
        loader = make_loader()
        iterator = iter(loader)
        head = [key(next(iterator)) for _ in range(point)]
        state = json.loads(json.dumps(loader.state_dict()))  # plain values only
        del iterator
        resumed = make_loader()
        resumed.load_state_dict(state)
        first = [key(item) for item in resumed]
        if point == len(epochs[0]):
            assert first == epochs[1], "a state saved at the end resumes with the next epoch"
            continue
        assert head + first == epochs[0], f"resume at {point} of {len(epochs[0])} differs"
        assert [key(item) for item in resumed] == epochs[1], f"epoch after resume at {point}"
