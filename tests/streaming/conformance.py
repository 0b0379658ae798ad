"""The resume-conformance check shared by every loader that saves positions.

A loader conforms when, for any point ``k``: take ``k`` items, save ``state_dict()``, build a
fresh loader, ``load_state_dict(state)``, and the fresh loader yields exactly the items the
uninterrupted one yields after ``k`` - at mid-epoch, at the end of the epoch (it then goes on
with the next epoch), and the epoch after is unaffected. States must be plain JSON-able values.
Every resume is also audited as a user's loop would (:class:`~shardstream.ResumeAudit`): no
duplicates and no skips across the restart.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import Callable
from typing import Any, Protocol

from shardstream import ResumeAudit
from shardstream.streaming._checks import keys_of


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
    epochs: list[list[Any]] = [[], []]
    samples: set[str] = set()  # the first epoch's keys: what each epoch holds once
    for epoch in epochs:
        for item in loader:
            epoch.append(key(item))
            samples.update(keys_of(item) if epoch is epochs[0] else ())
    assert epochs[0] and epochs[0] != epochs[1], "passes must move on to the next epoch"
    rng = random.Random(seed)
    points = {0, len(epochs[0]), *(rng.randrange(1, len(epochs[0])) for _ in range(num_points))}
    for point in sorted(points):
        with tempfile.TemporaryDirectory() as folder:
            _check_point(make_loader, key, epochs, point, folder, len(samples))


def _check_point(
    make_loader: Callable[[], Any], key: Callable[[Any], Any], epochs: list[list[Any]],
    point: int, folder: str, num_samples: int,
) -> None:  # fmt: skip
    """Resume at ``point`` of the first epoch; the run before and after it is audited."""
    loader = make_loader()
    iterator = iter(loader)
    audit = ResumeAudit(folder, rank=0)
    head = []
    for step in range(point):
        item = next(iterator)
        audit.record(step, item)
        head.append(key(item))
    state = json.loads(json.dumps(loader.state_dict()))  # plain values only
    del iterator
    resumed = make_loader()
    resumed.load_state_dict(state)
    audit = ResumeAudit(folder, rank=0)  # the restarted run
    epoch = 1 if point == len(epochs[0]) else 0
    first = _audited(resumed, key, audit, point, epoch)
    if epoch == 1:
        assert first == epochs[1], "a state saved at the end resumes with the next epoch"
    else:
        assert head + first == epochs[0], f"resume at {point} of {len(epochs[0])} differs"
        second = _audited(resumed, key, audit, len(epochs[0]), 1)
        assert second == epochs[1], f"epoch after resume at {point}"
    report = ResumeAudit.report(folder, expected=num_samples)
    for audited in report.epochs:
        assert (audited.duplicates, audited.skips) == (0, 0), f"resume at {point}: {report}"


def _audited(
    loader: Any, key: Callable[[Any], Any], audit: ResumeAudit, first_step: int, epoch: int
) -> list[Any]:
    """A pass's items as ``key`` sees them, each recorded in ``audit`` with its step."""
    found = []
    for step, item in enumerate(loader, first_step):
        audit.record(step, item, epoch)
        found.append(key(item))
    return found
