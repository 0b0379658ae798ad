"""Random access to a dataset with a manifest: a sample by position or by key, one ranged read.

Streaming reads shards front to back; evaluation, debugging and samplers people already have
want sample ``i``, or the sample with key ``k``. A :class:`RandomAccessDataset` maps a position
to its shard and ordinal with the manifest's counts, and reads exactly that sample's bytes with
the shard's index: one ranged read on an object store (after the shard's index, read once and
cached), one memory map locally. Looking a sample up by key uses the key hashes the indexes
hold: the first lookup builds a sorted table of them (16 bytes per sample), later ones are a
binary search. Views (:mod:`shardstream._catalog.views`) work alike, over their kept samples.
:meth:`RandomAccessDataset.evaluation_part` gives each rank an equal share for evaluation that
counts every sample exactly once (:class:`EvaluationPart`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import numpy as np
import torch.utils.data

from shardstream._catalog.shardlist import ShardList, Source, resolve_source
from shardstream._format.keys import key_hash
from shardstream._storage.background import ProcessLocal
from shardstream.errors import ConfigError, ShardstreamError
from shardstream.streaming._control.context import current_context
from shardstream.streaming._decoding.decode import SampleConverter
from shardstream.streaming._decoding.gpudecode import GpuDecode
from shardstream.streaming._options import DecodeMode, StreamOptions, with_storage_options
from shardstream.streaming._worker.reader import SKIP_ADVICE, ReadSettings, ShardReader

__all__ = ["EvaluationPart", "RandomAccessDataset"]


class RandomAccessDataset(torch.utils.data.Dataset):
    """A map-style dataset over shards with a manifest: ``ds[i]`` and ``ds.by_key(key)``.

    Args:
        source: A dataset folder or URL with a manifest (built, indexed, or a view).
        decode: ``"raw"`` bytes, ``"pil"``, ``"rgb8"`` or ``f(bytes, ext)``, as for
            :class:`~shardstream.StreamingDataset`.
        transform: Applied to each decoded image.
        options: ``output``, ``allow_pickle``, ``max_member_bytes``, ``memory_map``, and
            ``storage_options``/``read_options`` for remote datasets.
        version: Read this version of a dataset that grew (None: the newest); positions
            ``0 .. len-1`` of a version never change as the dataset grows.
        storage_options: Credentials and settings of a remote store; the same as
            ``StreamOptions(storage_options=...)``.

    Examples:
        >>> ds = RandomAccessDataset("s3://bucket/val", decode="pil",
        ...                          options=StreamOptions(output="dict"))  # doctest: +SKIP
        >>> ds[12345]["__key__"], ds.by_key("n01440764_10026")["label"]  # doctest: +SKIP
    """

    def __init__(
        self,
        source: Source,
        *,
        decode: DecodeMode | str | Callable[[bytes, str], Any] = "rgb8",
        transform: Callable[[Any], Any] | None = None,
        options: StreamOptions | None = None,
        version: int | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.options = with_storage_options(options, storage_options)
        if isinstance(decode, GpuDecode) or (isinstance(decode, str) and decode.startswith("cuda")):
            raise ConfigError(
                f"RandomAccessDataset decodes where it is indexed (often in DataLoader workers, "
                f"where CUDA cannot start), so decode={decode!r} is not taken: use decode='raw' "
                "and decode the bytes on the GPU in the training process, or a CPU decode mode"
            )
        _, self.shards, manifest = resolve_source(
            source, self.options.storage_options, self.options.read_options, version
        )
        #: The dataset version read (positions stay valid for it, however the dataset grows).
        self.version = manifest.version if manifest is not None else None
        if manifest is None:
            raise ConfigError(
                f"{source!r} has no manifest, so positions are unknown; run `shardstream "
                "index` on the shards first"
            )
        self._starts = np.zeros(len(self.shards) + 1, dtype=np.int64)
        np.cumsum(self.shards.counts(), out=self._starts[1:])
        self.convert = SampleConverter(
            decode, transform, self.options.output, self.options.allow_pickle
        )
        self._readers: ProcessLocal[ShardReader] = ProcessLocal(self._new_reader)
        self._keys: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __repr__(self) -> str:
        where = ", ".join(repr(source.shards.shown()) for source in self.shards.sources)
        version = "" if self.version is None else f", version={self.version}"
        return (
            f"RandomAccessDataset({where}, {len(self)} samples in {len(self.shards)} shards"
            f"{version}, decode={self.convert.decode!r})"
        )

    def reader(self) -> ShardReader:
        """This process's shard reader (DataLoader workers each make their own)."""
        return self._readers.get()

    def _new_reader(self) -> ShardReader:
        options = self.options
        return ShardReader(self.shards, ReadSettings(options.max_member_bytes, options.memory_map))

    def locate(self, position: int) -> tuple[int, int]:
        """``(shard number, sample within it)`` of a position (negative counts from the end)."""
        size = len(self)
        if not -size <= position < size:
            raise IndexError(f"position {position} of a dataset of {size} samples")
        position %= size
        shard = int(np.searchsorted(self._starts, position, side="right")) - 1
        return shard, position - int(self._starts[shard])

    def raw(self, position: int) -> dict[str, Any]:
        """The sample at ``position`` as read: ``__key__``, ``__url__`` and member bytes."""
        shard, ordinal = self.locate(position)
        with _told_without_skipping():
            sample = next(iter(self.reader().open(shard, ordinal, ordinal + 1)))
        return {
            k: bytes(v) if isinstance(v, (memoryview, bytearray)) else v for k, v in sample.items()
        }

    def __getitem__(self, position: int) -> Any:
        sample = self.raw(position)
        with _told_without_skipping():
            return self.convert(sample)

    def index_of(self, key: str) -> int:
        """The position of the sample with ``key``.

        Raises:
            KeyError: No sample has that key; for a key this version excludes, the message
                names the version that excluded it.
        """
        hashes, positions = self._key_table()
        wanted = key_hash(key)
        first = int(np.searchsorted(hashes, wanted, side="left"))
        last = int(np.searchsorted(hashes, wanted, side="right"))
        for position in positions[first:last].tolist():  # equal hashes: compare the keys
            if self.raw(position)["__key__"] == key:
                return int(position)
        version = _excluded_in(self.shards, self.reader(), wanted)
        if version == 0:  # the exclusion list of a view by fields (make_view(..., where=...))
            raise KeyError(f"{key!r}: its fields do not satisfy this view's predicate")
        if version is not None:
            raise KeyError(
                f"{key!r}: excluded from the dataset in version {version} (`shardstream "
                f"exclude`); this is version {self.version}. Read version={version - 1} for it."
            )
        raise KeyError(key)

    def by_key(self, key: str) -> Any:
        """The sample with ``key``, converted as ``ds[i]`` is."""
        return self[self.index_of(key)]

    def evaluation_part(
        self, rank: int | None = None, world_size: int | None = None
    ) -> EvaluationPart:
        """This rank's share for exact evaluation: see :class:`EvaluationPart`.

        Args:
            rank: This rank (with ``world_size``; default ``StreamOptions(rank=...)``, else
                ``torch.distributed``).
            world_size: Number of ranks.

        Examples:
            >>> part = ds.evaluation_part()  # doctest: +SKIP
            >>> for images, labels, valid in DataLoader(part, batch_size=64): ...  # doctest: +SKIP
        """
        if rank is None and world_size is None:
            rank, world_size = self.options.rank, self.options.world_size
        context = current_context(rank, world_size)
        return EvaluationPart(self, context.rank, context.world_size)

    def _key_table(self) -> tuple[np.ndarray, np.ndarray]:
        """Every sample's key hash, sorted, with its position (built once, from the indexes)."""
        if self._keys is None:
            reader = self.reader()
            hashes = np.empty(len(self), dtype=np.int64)
            for shard in range(len(self.shards)):
                index = reader.index(shard)
                if index is None or index.key_hashes is None:
                    name = self.shards.spec(shard).name
                    raise ConfigError(
                        f"{name}: its index has no key hashes (an older build, or a gzipped "
                        "shard); run `shardstream index --overwrite` on the dataset to look "
                        "samples up by key"
                    )
                kept = reader.kept(shard)
                keys = index.key_hashes if kept is None else index.key_hashes[kept]
                hashes[int(self._starts[shard]) : int(self._starts[shard + 1])] = keys
            order = np.argsort(hashes, kind="stable")
            self._keys = (hashes[order], order.astype(np.int64))
        return cast(tuple[np.ndarray, np.ndarray], self._keys)


class EvaluationPart(torch.utils.data.Dataset):
    """One rank's equal share of a :class:`RandomAccessDataset`, each sample marked ``__valid__``.

    Every rank gets ``ceil(N / world_size)`` positions, rank ``r`` those from ``r * P`` on, so
    a plain DataLoader (no ``DistributedSampler``) gives every rank the same number of batches.
    The positions past the end wrap around to the start: those *fillers* are real samples (the
    same shapes and transforms) marked invalid, so over all ranks the valid entries are every
    sample exactly once. A sample is ``(image, label, valid)``, or a dict with ``__valid__``;
    ``default_collate`` makes ``valid`` a bool tensor.

    Args:
        dataset: The random access dataset.
        rank: This rank.
        world_size: Number of ranks.

    Examples:
        >>> part = EvaluationPart(ds, rank=1, world_size=4)  # doctest: +SKIP
        >>> image, label, valid = part[0]  # doctest: +SKIP
    """

    def __init__(self, dataset: RandomAccessDataset, rank: int, world_size: int) -> None:
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self.dataset, self.rank, self.world_size = dataset, rank, world_size
        self._per_rank = -(-len(dataset) // world_size)

    def __len__(self) -> int:
        return self._per_rank

    def __getitem__(self, index: int) -> Any:
        if not 0 <= index < self._per_rank:
            raise IndexError(f"index {index} of an evaluation part of {self._per_rank} samples")
        position = self.rank * self._per_rank + index
        total = len(self.dataset)
        sample = self.dataset.raw(position % total)
        sample["__valid__"] = position < total
        with _told_without_skipping():
            return self.dataset.convert(sample)


@contextlib.contextmanager
def _told_without_skipping() -> Iterator[None]:
    """Random access reads every sample asked for (it has no ``on_error``): a broken one's
    error does not advise passing ``on_error='skip'``."""
    try:
        yield
    except ShardstreamError as error:
        if len(error.args) == 1 and isinstance(error.args[0], str):
            error.args = (SKIP_ADVICE.sub("", error.args[0]),)
        raise


def _excluded_in(shards: ShardList, reader: ShardReader, key_hash: int) -> int | None:
    """The version that excluded a sample with ``key_hash`` (None: none did); reads the
    indexes of the shards with exclusions, so it is for a key that was not found."""
    for number, source in enumerate(shards.sources):
        if source.exclusions is None:
            continue
        for local in source.exclusions.shards().tolist():
            index = reader.index(int(shards.firsts[number]) + local)
            if index is None or index.key_hashes is None:
                continue
            positions = source.exclusions.positions(local)
            found = np.flatnonzero(index.key_hashes[positions] == key_hash)
            if len(found):
                return source.exclusions.version_of(local, int(positions[found[0]]))
    return None
