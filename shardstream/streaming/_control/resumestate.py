"""The resume state's codec: the one place a state dict (the loader's, a worker's, or the pass
a loader posts to its workers) is built and read, and what may change between a save and a
restart. A change of the format touches this module and its test only."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from shardstream.errors import ConfigError
from shardstream.streaming._planning.leftover import PassRecord
from shardstream.streaming._planning.split import Layout

__all__ = [
    "STATE_VERSION",
    "PassState",
    "SavedState",
    "VersionNumber",
    "WorkerPosition",
    "check_fingerprint",
    "check_layout",
    "decode_pass",
    "decode_state",
    "encode_pass",
    "encode_state",
]

#: A dataset's version; a mixture's is the tuple of its streams' versions; None without one.
VersionNumber = int | tuple[int, ...] | None

#: 5: windows interleaved stratified (``interleave`` in the fingerprint); version 4 and 3 states
#: were saved in the uniform interleave and continue in it (``interleave="uniform"``).
#: 4: the epoch read in chunks (``chunk_size`` in the fingerprint).
#: 3: windows in closed form and plan layouts, in the whole-shard order: read as version 4 with
#: ``chunk_size=0``, so they continue exactly with the options of the order they were saved in.
#: States of 2 and older were saved with another sample order and are refused.
STATE_VERSION = 5
_UNCHUNKED_VERSION = 3
_UNIFORM_VERSION = 4


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
            the dataset opened; see :mod:`shardstream.streaming._control.versionset`).
    """

    epoch: int
    history: tuple[PassRecord, ...] = ()
    plan: Layout | None = None
    consumed: int = 0
    dataset_version: VersionNumber = None


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


@dataclasses.dataclass(frozen=True)
class SavedState:
    """A state dict, read: the pass, the layout it was saved at, and what else it records.

    Attributes:
        state: The pass.
        layout: The physical layout (ranks, workers, batch size) it was saved at.
        fingerprint: The settings and dataset facts that fix the epoch's order.
        worker: A dataset's per-worker state: the worker's place; None in a loader's.
        global_batches: The rank's batches in all epochs (a loader's; None before it was
            recorded).
        versioned: The state names the dataset version its epoch reads (states saved before
            versions existed do not: they were saved on version 1).
    """

    state: PassState
    layout: Layout
    fingerprint: dict[str, Any]
    worker: WorkerPosition | None = None
    global_batches: int | None = None
    versioned: bool = True


def _version_number(value: Any) -> VersionNumber:
    """A dataset version from plain values (a mixture's: its streams', as a list)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return tuple(int(item) for item in value)
    return int(value)


def _layout(data: Mapping[str, Any]) -> Layout:
    return Layout(int(data["world_size"]), int(data["num_workers"]), int(data["batch_size"]))


#: Keys whose names differ from their fields' (as earlier releases saved them).
_KEYS = {"consumed": "consumed_batches"}
#: How a field of each annotated type is saved as plain values (others: as they are) ...
_ENCODE: dict[str, Callable[[Any], Any]] = {
    "tuple[PassRecord, ...]": lambda records: [
        {**dataclasses.asdict(record.layout), "consumed_steps": record.consumed_steps}
        for record in records
    ],
    "Layout | None": lambda layout: None if layout is None else dataclasses.asdict(layout),
    "VersionNumber": lambda number: list(number) if isinstance(number, tuple) else number,
}
#: ... and read back.
_DECODE: dict[str, Callable[[Any], Any]] = {
    "int": int,
    "tuple[PassRecord, ...]": lambda items: tuple(
        PassRecord(_layout(item), int(item["consumed_steps"])) for item in items
    ),
    "Layout | None": lambda data: None if data is None else _layout(data),
    "VersionNumber": _version_number,
}


def _fields_out(value: Any) -> dict[str, Any]:
    """A dataclass's fields as plain values (see ``_KEYS`` and ``_ENCODE``)."""
    return {
        _KEYS.get(field.name, field.name): _ENCODE.get(str(field.type), _same)(
            getattr(value, field.name)
        )
        for field in dataclasses.fields(value)
    }


def _fields_in(cls: Any, data: Mapping[str, Any]) -> Any:
    """``cls`` from plain values; a field missing from ``data`` (an older state) keeps its
    default."""
    values = {}
    for field in dataclasses.fields(cls):
        key = _KEYS.get(field.name, field.name)
        if key in data:
            values[field.name] = _DECODE.get(str(field.type), _same)(data[key])
        elif field.default is dataclasses.MISSING:
            raise KeyError(key)
    return cls(**values)


def _same(value: Any) -> Any:
    return value


def encode_pass(state: PassState) -> dict[str, Any]:
    """A pass as plain values: what a loader posts to its workers, and part of every state."""
    return _fields_out(state)


def decode_pass(data: Mapping[str, Any]) -> PassState:
    """Inverse of :func:`encode_pass`.

    Raises:
        ConfigError: A field is missing or not of its type (names it).
    """
    try:
        return _fields_in(PassState, data)
    except (KeyError, TypeError, ValueError) as error:
        raise _malformed(error) from error


def encode_state(
    state: PassState,
    layout: Layout,
    fingerprint: dict[str, Any],
    worker: WorkerPosition | None = None,
    global_batches: int | None = None,
) -> dict[str, Any]:
    """A state dict: the loader's, or with ``worker`` a dataset's per-worker one.

    Plain values only (safe under ``torch.load(weights_only=True)``; nothing grows with the
    samples), the same on every rank, so a checkpoint written by rank 0 alone restores every
    rank. A loader's state also records ``global_batches``, the batches the rank consumed in
    all epochs (what a trainer's step counts).

    Examples:
        >>> state = encode_state(PassState(1), Layout(2, 4, 8), {"seed": 0})
        >>> decode_state(state).state.epoch, decode_state(state).layout
        (1, Layout(world_size=2, num_workers=4, batch_size=8))
    """
    return {
        "version": STATE_VERSION,
        **encode_pass(state),
        **(_fields_out(worker) if worker is not None else {}),
        **_fields_out(layout),
        "fingerprint": fingerprint,
        **({"global_batches": global_batches} if global_batches is not None else {}),
    }


def decode_state(data: Mapping[str, Any]) -> SavedState:
    """Inverse of :func:`encode_state`, for states of this version and of versions 3 and 4.

    Raises:
        ConfigError: Another format version (older states were saved with another sample
            order), or a field is missing or not of its type (names it).
    """
    version = data.get("version")
    if version not in (STATE_VERSION, _UNIFORM_VERSION, _UNCHUNKED_VERSION):
        raise ConfigError(
            f"resume state version {version!r} is not supported (this release reads version "
            f"{STATE_VERSION}, 4 and 3; older states were saved with another sample order, so they "
            "cannot continue an epoch exactly). Start the epoch over without load_state_dict."
        )
    state = decode_pass(data)
    try:
        worker = _fields_in(WorkerPosition, data) if "start" in data else None
        total = data.get("global_batches")
        return SavedState(
            state, _fields_in(Layout, data), dict(data["fingerprint"]), worker,
            None if total is None else int(total), "dataset_version" in data,
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as error:
        raise _malformed(error) from error


def _malformed(error: Exception) -> ConfigError:
    return ConfigError(f"malformed resume state ({error!r}); was it saved by shardstream?")


def check_fingerprint(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Refuse a state whose order-fixing settings differ from the current ones.

    A fingerprint without ``chunk_size`` (a version 3 state) was saved reading whole shards;
    one without ``interleave`` (versions 3 and 4) in the uniform interleave.

    Raises:
        ConfigError: Names the first differing setting with both values.
    """
    uniform_era = "interleave" not in saved
    if uniform_era:
        saved = {**saved, "interleave": "uniform"}
    if "chunk_size" not in saved:
        saved = {**saved, "chunk_size": 0}
        order = ("chunk_size", "num_open", "piece_size", "interleave")
        if any(saved.get(name) != current.get(name) for name in order):
            wanted = ", ".join(f"{name}={saved.get(name)!r}" for name in order)
            raise ConfigError(
                "cannot resume: this state (format 3) was saved in the whole-shard order, "
                "which read whole shards in a shuffled order; to finish its epoch exactly, pass "
                f"StreamOptions({wanted}) (or start the epoch over without load_state_dict)"
            )
    elif uniform_era and current.get("interleave") != "uniform":
        raise ConfigError(
            "cannot resume: this state (format 4) was saved by shardstream 0.2 or earlier, "
            "whose windows interleave their pieces uniformly at random; to finish its epoch "
            "exactly, pass StreamOptions(interleave='uniform') (or start the epoch over "
            "without load_state_dict)"
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
