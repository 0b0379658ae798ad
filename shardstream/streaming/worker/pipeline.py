"""What one DataLoader worker runs: open pieces, interleave, shuffle, decode, batch.

The stages work on sample references first, so a worker that resumes at sample ``p`` replays the
interleave and shuffle draws on integers (no I/O) to find their exact state, then re-reads only
the samples that the shuffle buffer held (bounded replay).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from shardstream.errors import DecodeError, ShardFormatError, StorageError
from shardstream.format.tarreader import DEFAULT_MAX_MEMBER_BYTES, is_gzip_name
from shardstream.storage import Store
from shardstream.streaming.planning.passes import StageOptions, build_stages
from shardstream.streaming.planning.shuffle import ShuffleBuffer
from shardstream.streaming.planning.split import Piece
from shardstream.streaming.shardlist import ShardSpec
from shardstream.streaming.worker.pieces import HandlePool, IndexCache, OffsetIndex, read_piece

__all__ = ["WorkerJob", "fast_forward", "guard_piece", "run_worker"]

logger = logging.getLogger("shardstream.streaming")


@dataclasses.dataclass(frozen=True)
class WorkerJob:
    """Everything one worker needs for one epoch (plain values, cheap to build).

    Attributes:
        stores: Where the shards are (reopened in each worker process).
        shards: The shards; ``Piece.shard`` indexes into it, ``ShardSpec.store`` into
            ``stores``.
        pieces: Pieces to read; ``stop == -1`` means "to the end" (no manifest).
        seed: Seed sequence of the stages (see :func:`remainder.worker_seed`).
        stage: Shuffle on or off, pieces read at once, shuffle buffer size.
        skip_samples: Samples of this worker already consumed (resume).
        on_error: ``"raise"`` or ``"skip"``.
        max_member_bytes: Largest tar member read into memory.
        memory_map: Read indexed local shards through memory maps.
        tag_streams: Add ``__stream__`` (the shard's store number) to every sample.
    """

    stores: tuple[Store, ...]
    shards: tuple[ShardSpec, ...]
    pieces: tuple[Piece, ...]
    seed: tuple[int, ...]
    stage: StageOptions
    skip_samples: int = 0
    on_error: str = "raise"
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES
    memory_map: bool = True
    tag_streams: bool = False

    @property
    def lengths(self) -> list[int | None]:
        """Samples per piece, None where unknown."""
        return [None if p.stop < 0 else p.num_samples for p in self.pieces]


def guard_piece(
    samples: Iterator[Any], count: int | None, on_error: str, skipped: list[int]
) -> Iterator[Any]:
    """Pass samples through; with ``on_error="skip"`` turn a broken shard into counted gaps.

    The rest of a broken piece becomes ``None`` placeholders, so batch boundaries (and thus the
    equal batch counts across ranks) do not move.
    """
    if on_error != "skip":
        return samples  # errors propagate as they are: no layer to pass through
    return _guarded(samples, count, skipped)


def _guarded(samples: Iterator[Any], count: int | None, skipped: list[int]) -> Iterator[Any]:
    produced = 0
    try:
        for sample in samples:
            produced += 1
            yield sample
    except (ShardFormatError, StorageError) as error:
        missing = 1 if count is None else count - produced
        skipped[0] += missing
        logger.warning("skipping %d sample(s): %s", missing, error)
        if count is not None:
            yield from itertools.repeat(None, count - produced)


def fast_forward(job: WorkerJob) -> dict[str, Any]:
    """The stages' state after ``job.skip_samples`` samples, found by replaying on integers."""
    stages = build_stages(
        job.lengths, lambda piece, start, stop: itertools.repeat(None, stop - start), job.seed,
        job.stage,
    )  # fmt: skip
    for _ in itertools.islice(iter(stages), job.skip_samples):
        pass
    return stages.state_dict()


def _real_opener(
    job: WorkerJob, pools: list[HandlePool], indexes: list[IndexCache], skipped: list[int]
) -> Callable[..., Iterator[Any]]:
    index = OffsetIndex()

    def open_piece(number: int, start: int, stop: int) -> Iterator[Any]:
        piece = job.pieces[number]
        shard = job.shards[piece.shard]
        end = None if stop < 0 else piece.start + stop
        offsets = None
        if shard.index is not None and not is_gzip_name(shard.name):
            offsets = indexes[shard.store].get(shard.index, shard.num_samples, shard.num_bytes)
        pool = pools[shard.store]
        samples = read_piece(
            pool,
            shard.name,
            piece.start + start,
            end,
            index,
            offsets,
            job.max_member_bytes,
            job.memory_map,
        )
        if job.tag_streams:
            samples = _tagged(samples, shard.store)
        return guard_piece(samples, None if end is None else stop - start, job.on_error, skipped)

    return open_piece


def run_worker(
    job: WorkerJob,
    convert: Callable[[dict[str, Any]], Any],
    batch_size: int | None,
    collate: Callable[[Sequence[Any]], Any],
    progress: list[int] | None = None,
) -> Iterator[Any]:
    """Yield converted samples (or collated batches of ``batch_size`` slots) for one worker.

    A batch is ``batch_size`` consecutive slots of the shuffled stream; skipped samples leave
    the batch shorter rather than shifting later batches, so every rank keeps the same number
    of batches. ``progress[0]`` counts the batches (slots without batching) handed out, for a
    resume state taken while the worker is paused between them.
    """
    skipped = [0]
    idle = max(8, job.stage.num_open)
    pools = [HandlePool(store, max_idle=idle) for store in job.stores]
    try:
        opener = _real_opener(job, pools, [IndexCache(store) for store in job.stores], skipped)
        stages = build_stages(job.lengths, opener, job.seed, job.stage)
        chunks = _batches(_slots(job, stages), convert, batch_size, collate, job, skipped)
        yield from _counted(chunks, progress if progress is not None else [0])
    finally:
        for pool in pools:
            pool.close()
    if skipped[0]:
        logger.warning("worker %s skipped %d sample(s) this epoch", job.seed[2:], skipped[0])


def _tagged(samples: Iterator[Any], stream: int) -> Iterator[Any]:
    for sample in samples:
        sample["__stream__"] = stream
        yield sample


def _counted(chunks: Iterator[list[Any]], progress: list[int]) -> Iterator[Any]:
    for kept in chunks:
        progress[0] += 1  # before handing out: a state taken at the pause includes this one
        yield from kept


def _slots(job: WorkerJob, stages: ShuffleBuffer) -> Iterator[Any]:
    """The worker's stream of raw samples, fast-forwarded past what a resume skips."""
    known = all(length is not None for length in job.lengths)
    if job.skip_samples and known:
        stages.load_state_dict(fast_forward(job))
    slots: Iterator[Any] = map(operator.itemgetter(1), stages)  # the samples, not their refs
    if job.skip_samples and not known:  # no manifest: replay and skip (read, not decoded)
        slots = itertools.islice(slots, job.skip_samples, None)
    return slots


def _batches(
    slots: Iterator[Any],
    convert: Callable[[dict[str, Any]], Any],
    batch_size: int | None,
    collate: Callable[[Sequence[Any]], Any],
    job: WorkerJob,
    skipped: list[int],
) -> Iterator[list[Any]]:
    """Per chunk of ``batch_size`` slots (one slot without batching), what to hand out."""
    size = batch_size or 1
    while True:
        chunk = list(itertools.islice(slots, size))
        if not chunk:
            return
        converted = [_convert(sample, convert, job.on_error, skipped) for sample in chunk]
        kept = [value for value in converted if value is not None]
        if batch_size is None:
            yield kept
        elif kept:
            yield [collate(kept)]
        else:
            raise DecodeError(
                f"all {len(chunk)} samples of one batch failed to load (see the log); an empty "
                "batch cannot be collated. Check the shards with `shardstream verify`."
            )


def _convert(sample: Any, convert: Callable[[Any], Any], on_error: str, skipped: list[int]) -> Any:
    if sample is None:
        return None
    try:
        return convert(sample)
    except DecodeError as error:
        if on_error != "skip":
            raise
        skipped[0] += 1
        logger.warning("skipping sample: %s", error)
        return None
