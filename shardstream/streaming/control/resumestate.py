"""Resume states: one codec for the loader's state, the dataset's per-worker state and the
directive the loader posts to its workers; and what may change between a save and a restart.
:func:`encode_state` is the one place a state dict is built.

Each is a small dict of plain values (safe under ``torch.load(weights_only=True)``; no list
grows with the samples), the same on every rank, so a checkpoint written by rank 0 alone
restores every rank:

- the *loader* state (:class:`~shardstream.streaming.StreamingDataLoader`): the epoch, the
  earlier passes of the epoch, the current pass's plan layout and the steps the rank consumed
  in it. It restores at any world size and worker count: a world size that divides the pass's
  plan continues the pass (the same global batches), any other starts a new pass with what is
  left (see :mod:`shardstream.streaming.planning.history`);
- the *dataset* state, per worker, for loaders that follow the ``Stateful`` protocol
  (torchdata's ``StatefulDataLoader``): the same, with the steps that worker served. Such
  loaders restore each worker's state into the same worker, so the world size and worker count
  must stay the same.

Both record the version of a growing dataset the epoch reads (``dataset_version``; states
saved before versions existed have none and were saved on version 1).

In both, the settings that fix which samples an epoch holds and in which order (seed, shuffle,
policy, the dataset itself and the reading settings) must not change; a change is refused with
an error naming the setting, its saved and its current value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from shardstream.errors import ConfigError
from shardstream.streaming.planning.history import PassRecord
from shardstream.streaming.planning.split import Layout

__all__ = [
    "STATE_VERSION",
    "PassState",
    "VersionNumber",
    "WorkerPosition",
    "check_fingerprint",
    "check_layout",
    "check_version",
    "encode_state",
    "layout_from_dict",
    "version_number",
]

#: A dataset's version; a mixture's is the tuple of its streams' versions; None without one.
VersionNumber = int | tuple[int, ...] | None

#: 4: the epoch read in chunks (``chunk_size`` in the fingerprint, shardstream 0.3).
#: 3: windows in closed form and plan layouts (shardstream 0.2): read as version 4 with
#: ``chunk_size=0``, so they continue exactly with the options of the order they were saved in.
#: States of 2 and older were saved with another sample order and are refused.
STATE_VERSION = 4
_WHOLE_SHARDS_VERSION = 3


@dataclasses.dataclass(frozen=True)
class PassState:
    """Where a rank (or one of its workers) stands in an epoch.

    Attributes:
        epoch: The epoch.
        history: Earlier passes of the epoch (restarts at another layout).
        plan: The current pass's plan layout, or None before the pass is planned.
        consumed: Steps consumed in the current pass (by the rank; for a worker's state, the
            steps it served).
        dataset_version: The version of a growing dataset the epoch reads (None: the version
            the dataset opened; see :mod:`shardstream.streaming.control.versionset`).
    """

    epoch: int
    history: tuple[PassRecord, ...] = ()
    plan: Layout | None = None
    consumed: int = 0
    dataset_version: VersionNumber = None

    def as_dict(self) -> dict[str, Any]:
        """Plain values."""
        return {
            "epoch": self.epoch,
            "history": [record.as_dict() for record in self.history],
            "plan": self.plan.as_dict() if self.plan is not None else None,
            "consumed_batches": self.consumed,
            "dataset_version": (
                list(self.dataset_version)
                if isinstance(self.dataset_version, tuple)
                else self.dataset_version
            ),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PassState:
        """Inverse of :meth:`as_dict`.

        Raises:
            ConfigError: A field is missing or not of its type (names it).
        """
        try:
            plan = data.get("plan")
            version = data.get("dataset_version")
            return cls(
                int(data["epoch"]),
                tuple(PassRecord.from_dict(dict(item)) for item in data.get("history", ())),
                layout_from_dict(plan) if plan is not None else None,
                int(data.get("consumed_batches", 0)),
                version_number(version),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ConfigError(
                f"malformed resume state ({error!r}); was it saved by shardstream?"
            ) from error


@dataclasses.dataclass(frozen=True)
class WorkerPosition:
    """Where one process stands in its pass: what a dataset's per-worker state adds.

    Attributes:
        start: The step the loader's pass started at.
        role: Which turn of the loader's workers this process plays.
        served: Steps this process has served in the pass.
        token: The pass's id, the same in every worker of the rank.
        worker: The DataLoader worker that saved it.
    """

    start: int
    role: int
    served: int
    token: int
    worker: int

    def as_dict(self) -> dict[str, int]:
        """Plain values."""
        return dataclasses.asdict(self)


def encode_state(
    state: PassState,
    layout: Layout,
    fingerprint: dict[str, Any],
    worker: WorkerPosition | None = None,
    global_batches: int | None = None,
) -> dict[str, Any]:
    """A state dict: the loader's, or with ``worker`` a dataset's per-worker one.

    The one place either is built; :meth:`PassState.from_dict`, :func:`layout_from_dict` and
    the checks below read them. A loader's state also records ``global_batches``, the batches
    the rank consumed in all epochs (what a trainer's step counts; states saved before it
    existed load without it).
    """
    return {
        "version": STATE_VERSION,
        **state.as_dict(),
        **(worker.as_dict() if worker is not None else {}),
        **layout.as_dict(),
        "fingerprint": fingerprint,
        **({"global_batches": global_batches} if global_batches is not None else {}),
    }


def version_number(value: Any) -> VersionNumber:
    """A dataset version from a state's plain values (a mixture's: its streams', as a list)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return tuple(int(item) for item in value)
    return int(value)


def layout_from_dict(data: Mapping[str, Any]) -> Layout:
    """The layout in a state (``world_size``, ``num_workers``, ``batch_size``)."""
    return Layout(int(data["world_size"]), int(data["num_workers"]), int(data["batch_size"]))


def check_version(state: Mapping[str, Any]) -> None:
    """Refuse states of another format version."""
    version = state.get("version")
    if version not in (STATE_VERSION, _WHOLE_SHARDS_VERSION):
        raise ConfigError(
            f"resume state version {version!r} is not supported (this release reads version "
            f"{STATE_VERSION}; older states were saved with another sample order, so they "
            "cannot continue an epoch exactly). Start the epoch over without load_state_dict."
        )


def check_fingerprint(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Refuse a state whose order-fixing settings differ from the current ones.

    A fingerprint without ``chunk_size`` (a version 3 state) was saved reading whole shards.

    Raises:
        ConfigError: Names the first differing setting with both values.
    """
    if "chunk_size" not in saved:
        saved = {**saved, "chunk_size": 0}
        order = ("chunk_size", "num_open", "piece_size")
        if any(saved.get(name) != current.get(name) for name in order):
            wanted = ", ".join(f"{name}={saved.get(name)!r}" for name in order)
            raise ConfigError(
                "cannot resume: this state was saved by shardstream 0.2, which read whole "
                "shards in a shuffled order; to finish its epoch exactly, pass "
                f"StreamOptions({wanted}) (or start the epoch over without load_state_dict)"
            )
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
