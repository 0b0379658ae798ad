"""Resume states: what may change between a checkpoint and a restart, and what may not.

Two states exist, both small dicts of plain values (safe under ``torch.load(weights_only=True)``
and rank-agnostic, so a checkpoint written by rank 0 alone restores every rank):

- the *loader* state (:class:`~shardstream.streaming.StreamingDataLoader`): the epoch, the
  batches each rank consumed in the current pass, the earlier passes of the epoch and the
  layout. It restores at any world size and worker count (elastic resume, see
  :mod:`shardstream.streaming.planning.passes`);
- the *dataset* state, per worker, for loaders that follow the ``Stateful`` protocol
  (torchdata's ``StatefulDataLoader``): the same, with the batches (or samples) that worker
  yielded. Such loaders restore each worker's state into the same worker, so the world size
  and worker count must stay the same.

In both, the settings that fix which samples an epoch holds and in which order (seed, shuffle,
policy, the dataset itself and the reading stages) must not change; a change is refused with an
error naming the setting, its saved and its current value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardstream.errors import ConfigError
from shardstream.streaming.planning.passes import Layout, PassRecord

__all__ = [
    "STATE_VERSION",
    "check_fingerprint",
    "check_layout",
    "check_version",
    "history_from_state",
    "layout_from_state",
]

STATE_VERSION = 2


def check_fingerprint(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Refuse a state whose order-fixing settings differ from the current ones.

    Raises:
        ConfigError: Names the first differing setting with both values.
    """
    for name in sorted(set(saved) | set(current)):
        if saved.get(name) != current.get(name):
            raise ConfigError(
                f"cannot resume: {name} was {saved.get(name)!r} when the state was saved but is "
                f"{current.get(name)!r} now; which samples an epoch holds and their order depend "
                f"on it, so restart with {name}={saved.get(name)!r} (or start the epoch over "
                "without load_state_dict)"
            )


def check_layout(
    saved: Layout, current: Layout, *, elastic: bool, allow_new_batch_size: bool
) -> None:
    """Refuse layout changes that the resuming loader cannot follow.

    Raises:
        ConfigError: A changed world size or worker count where ``elastic`` is false, or a
            changed batch size without ``allow_new_batch_size``.
    """
    if saved.batch_size != current.batch_size and not allow_new_batch_size:
        raise ConfigError(
            f"cannot resume: batch_size was {saved.batch_size} when the state was saved but is "
            f"{current.batch_size} now; pass allow_new_batch_size=True to load_state_dict to "
            "continue the epoch with the new per-rank batch size"
        )
    for name in ("world_size", "num_workers"):
        before, now = getattr(saved, name), getattr(current, name)
        if before != now and not elastic:
            raise ConfigError(
                f"cannot resume: {name} was {before} when the state was saved but is {now} now. "
                "This state restores each DataLoader worker into the same worker (the Stateful "
                "protocol of torchdata's StatefulDataLoader), so it needs the same world size "
                "and worker count; use StreamingDataLoader's state_dict for elastic resume"
            )


def layout_from_state(state: Mapping[str, Any]) -> Layout:
    """The layout a state was saved with."""
    return Layout(int(state["world_size"]), int(state["num_workers"]), int(state["batch_size"]))


def history_from_state(state: Mapping[str, Any]) -> list[PassRecord]:
    """The earlier passes of the state's epoch."""
    return [PassRecord.from_dict(dict(item)) for item in state.get("history", ())]


def check_version(state: Mapping[str, Any]) -> None:
    """Refuse states of another format version."""
    if state.get("version") != STATE_VERSION:
        raise ConfigError(
            f"resume state version {state.get('version')!r} is not supported (this release "
            f"reads version {STATE_VERSION}); start the epoch over without load_state_dict"
        )
