"""Every setting of a StreamingDataset, validated once, and what the layers below need of them."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from shardstream.errors import ConfigError
from shardstream.storage.limits import file_budget
from shardstream.streaming.options import StreamOptions
from shardstream.streaming.planning.order import (
    DatasetFacts,
    OrderChoice,
    PlanOptions,
    choose_open_shards,
    choose_order,
)
from shardstream.streaming.planning.split import Layout
from shardstream.streaming.worker.reader import ReadSettings

__all__ = ["Settings"]

_DEFAULT_CANONICAL_WORKERS = 8
#: The order's numbers, each a ``StreamOptions`` field of the same name (None: chosen).
_ORDER_FIELDS = tuple(field.name for field in dataclasses.fields(OrderChoice))
#: Before the shards are known: no index, so whole shards (only for validating options).
_UNKNOWN = DatasetFacts(indexed=False, local=True, mean_sample_bytes=0.0)


@dataclasses.dataclass(frozen=True)
class Settings:
    """The dataset's settings: the constructor's arguments and its :class:`StreamOptions`.

    ``facts`` (from the manifest, see :meth:`with_facts`) decide the order's numbers that the
    options leave to shardstream (:mod:`~shardstream.streaming.planning.order`).

    Raises:
        ConfigError: Any value out of range, naming the setting and what it accepts.
    """

    seed: int
    shuffle: bool
    policy: str
    batch_size: int | None
    on_error: str
    epoch_size: int | None
    options: StreamOptions
    facts: DatasetFacts = _UNKNOWN

    def __post_init__(self) -> None:
        options = self.options
        if self.on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1 or None, got {self.batch_size}")
        if options.output not in ("pair", "dict"):
            raise ConfigError(f"output must be 'pair' or 'dict', got {options.output!r}")
        _check_range("batch_buffers", options.batch_buffers, 0, 64)
        _check_range("shuffle_buffer", options.shuffle_buffer, 0, None)
        _check_range("max_member_bytes", options.max_member_bytes, 1, None)
        for name in _ORDER_FIELDS:
            if getattr(options, name) is not None:
                _check_range(name, getattr(options, name), 0 if name == "chunk_size" else 1, None)
        if options.canonical_workers is not None and options.canonical_ranks is None:
            raise ConfigError("canonical_workers needs canonical_ranks")
        if options.canonical_ranks is not None:
            _check_range("canonical_ranks", options.canonical_ranks, 1, None)
            _check_range("canonical_workers", self.canonical_workers, 1, 1024)
            if self.batch_size is None:
                raise ConfigError(
                    "canonical_ranks needs batch_size: the same global batches are made of "
                    "every rank's batch of one step"
                )
        self.plan  # noqa: B018 - validates the planning options too

    def with_facts(self, facts: DatasetFacts) -> Settings:
        """These settings for a dataset with ``facts``."""
        return dataclasses.replace(self, facts=facts)

    @functools.cached_property
    def order(self) -> OrderChoice:
        """The order's chunk size, lanes and piece size: as set, or chosen from the facts."""
        given = {name: getattr(self.options, name) for name in _ORDER_FIELDS}
        return choose_order(self.facts, **given, batch_size=self.micro_batch)

    @property
    def open_shards(self) -> int:
        """Shards a worker reads at once without a manifest (within a quarter of the files
        the process may open: each open shard holds one)."""
        return max(1, min(choose_open_shards(self.facts, self.options.num_open),
                          file_budget(0.25, 4096)))  # fmt: skip

    @functools.cached_property
    def plan(self) -> PlanOptions:
        """What fixes the epoch's order (see :mod:`shardstream.streaming.planning`)."""
        return PlanOptions(self.seed, self.shuffle, self.policy, **dataclasses.asdict(self.order))

    @property
    def micro_batch(self) -> int:
        """Samples per step of one rank: the batch size, or 1 without batching."""
        return self.batch_size or 1

    @property
    def canonical_workers(self) -> int:
        """Streams per planned rank when ``canonical_ranks`` is set."""
        return self.options.canonical_workers or _DEFAULT_CANONICAL_WORKERS

    def read(self, tag_streams: bool) -> ReadSettings:
        """How workers read shards."""
        options = self.options
        return ReadSettings(
            options.max_member_bytes, options.memory_map, self.on_error, tag_streams,
            max(8, min(self.order.num_open, file_budget(0.25, 4096))),
            max(256, 2 * self.order.num_open),
            fields=options.output == "dict",  # pairs are (image, label): no other field
        )  # fmt: skip

    def plan_layout(self, physical: Layout) -> Layout:
        """The layout a fresh pass is planned for: the canonical one if set, else ``physical``.

        Raises:
            ConfigError: The world size does not divide ``canonical_ranks``, or the global
                batch (``batch_size * world_size``) is not a multiple of it.
        """
        ranks = self.options.canonical_ranks
        if ranks is None:
            return physical
        world, batch = physical.world_size, physical.batch_size
        if ranks % world or (batch * world) % ranks:
            raise ConfigError(
                f"canonical_ranks={ranks} needs a world size that divides it and a global "
                f"batch (batch_size x world_size = {batch} x {world}) that is a multiple of it"
            )
        return Layout(ranks, self.canonical_workers, batch * world // ranks)

    def fingerprint(self) -> dict[str, Any]:
        """The settings that fix which samples an epoch holds and their order."""
        options = self.options
        return {
            "seed": self.seed,
            "shuffle": self.shuffle,
            "policy": self.policy,
            **dataclasses.asdict(self.order),
            "shuffle_buffer": options.shuffle_buffer,
        }


def _check_range(name: str, value: int, low: int, high: int | None) -> None:
    if not isinstance(value, int) or value < low or (high is not None and value > high):
        bounds = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ConfigError(f"{name} must be an integer {bounds}, got {value!r}")
