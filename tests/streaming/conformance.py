"""The resume-conformance check shared by every stateful stage (and the loader).

A stage conforms when, for any point ``k``: take ``k`` items, save ``state_dict()``, build a
fresh stage, ``load_state_dict(state)``, and the fresh stage yields exactly the items the
uninterrupted stage yields after ``k`` - at mid-epoch, at the end of the epoch (nothing left),
and a new epoch started afterwards is unaffected. States must be plain JSON-able values.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from typing import Any, Protocol


class Stateful(Protocol):
    def __iter__(self) -> Any: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _take(stage: Stateful, count: int, key: Callable[[Any], Any]) -> list[Any]:
    items = []
    iterator = iter(stage)
    for _ in range(count):
        items.append(key(next(iterator)))
    return items


def assert_resumes(
    make_stage: Callable[[int], Stateful],
    key: Callable[[Any], Any] = lambda item: item,
    num_points: int = 3,
    seed: int = 0,
    extra_points: Iterable[int] = (),
) -> None:
    """Check resume at random mid-epoch points, at 0, at the end, and the next epoch.

    Args:
        make_stage: ``make_stage(epoch)`` builds a fresh stage for that epoch.
        key: Turns an item into something comparable with ``==`` (e.g. the sample keys).
        num_points: Random mid-epoch points to try.
        seed: Seed for choosing the points.
        extra_points: Further points to try.
    """
    full = [key(item) for item in make_stage(0)]
    assert full, "the stage yielded nothing"
    rng = random.Random(seed)
    points = {0, len(full), *extra_points}
    points.update(rng.randrange(1, len(full)) for _ in range(num_points) if len(full) > 1)
    for point in sorted(points):
        stage = make_stage(0)
        head = _take(stage, point, key)
        state = stage.state_dict()
        json.dumps(state)  # plain values only
        resumed = make_stage(0)
        resumed.load_state_dict(json.loads(json.dumps(state)))
        tail = [key(item) for item in resumed]
        assert head + tail == full, f"resume at {point} of {len(full)} differs"
    next_epoch = [key(item) for item in make_stage(1)]
    again = [key(item) for item in make_stage(1)]
    assert next_epoch == again, "a new epoch is not deterministic"
