"""How mixed a loader's batches are, against a uniformly random permutation of the same data.

Torch-free formulas over label arrays, shared by ``shardstream bench --shuffle`` and
``benchmarks/shuffle.py``:

- :func:`distinct_per_batch`: distinct labels in each batch (a buffer shuffle over shards
  written in class order holds few);
- :func:`random_distinct`: what a random permutation gives on average, exactly, from the
  label counts;
- :func:`spearman`: rank correlation between where samples were written and when they were
  read (a random order gives about 0; an order that follows the writing order, near 1).

``shardstream bench --shuffle``: how mixed the loader's batches are on the user's own data.

:func:`check_mix` runs the real loader (``StreamingDataLoader`` with the given workers, batch
size and options, as rank 0 of ``world_size``) reading only labels, and compares its batches
with a uniformly random permutation of the same data (this module): distinct labels per
batch, and, with a manifest, the rank correlation between where samples were written and when
they were read (from the plan, which the loader follows exactly). The random order's figure is
exact when the whole dataset was read; otherwise it comes from labels of samples drawn
uniformly through the shards' indexes. :func:`format_mix_report` prints a table and advice."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from shardstream._catalog.shardlist import Source
from shardstream.errors import ConfigError
from shardstream.streaming._control.resumestate import PassState
from shardstream.streaming._dataset import StreamingDataset
from shardstream.streaming._diagnostics.bench import format_table
from shardstream.streaming._loader import StreamingDataLoader
from shardstream.streaming._options import OnError, StreamOptions
from shardstream.streaming._planning.windows import planned_batches

__all__ = [
    "MixCheckOptions",
    "check_mix",
    "distinct_per_batch",
    "format_mix_report",
    "mix_advice",
    "random_distinct",
    "spearman",
]


def distinct_per_batch(batches: Sequence[np.ndarray]) -> np.ndarray:
    """Distinct labels in each batch.

    Examples:
        >>> distinct_per_batch([np.array([1, 1, 2]), np.array([3])]).tolist()
        [2, 1]
    """
    return np.array([len(np.unique(batch)) for batch in batches], dtype=np.int64)


def random_distinct(label_counts: np.ndarray, batch_size: int) -> float:
    """Mean distinct labels in a batch of a uniformly random permutation of the samples.

    A label with ``n`` of ``N`` samples is missing from a batch of ``b`` drawn without
    replacement with probability ``C(N - n, b) / C(N, b)``.

    Examples:
        >>> round(random_distinct(np.array([1, 1]), 2), 3)
        2.0
        >>> round(random_distinct(np.array([50, 50]), 1), 3)
        1.0
    """
    counts = [int(count) for count in np.asarray(label_counts).ravel() if count > 0]
    total = sum(counts)
    batch = min(batch_size, total)
    if batch <= 0:
        return 0.0
    whole = math.lgamma(total + 1) - math.lgamma(total - batch + 1)
    absent = 0.0
    for count in counts:  # per label, not per sample: log-gamma of the binomials' ratio
        rest = total - count
        if rest >= batch:
            absent += math.exp(math.lgamma(rest + 1) - math.lgamma(rest - batch + 1) - whole)
    return len(counts) - absent


def spearman(written: np.ndarray, read_order: np.ndarray | None = None) -> float:
    """Spearman rank correlation of written positions against the order they were read in.

    Args:
        written: Each read sample's written position (any sortable key), in reading order.
        read_order: The reading positions (default ``0..n-1``).

    Examples:
        >>> spearman(np.array([0, 1, 2, 3]))
        1.0
        >>> spearman(np.array([3, 2, 1, 0]))
        -1.0
    """
    written = np.asarray(written)
    if len(written) < 2:
        return 0.0
    order = np.arange(len(written)) if read_order is None else np.asarray(read_order)
    ranks = np.empty(len(written), dtype=np.float64)
    ranks[np.argsort(written, kind="stable")] = np.arange(len(written))
    value = np.corrcoef(ranks, order)[0, 1]
    return float(round(value, 12))


#: Batches read when the user gives no count: enough for stable figures, bounded time.
DEFAULT_MAX_BATCHES = 2000


@dataclasses.dataclass(frozen=True)
class MixCheckOptions:
    """What :func:`check_mix` reads.

    Attributes:
        workers: DataLoader workers.
        batch_size: Samples per batch of the rank.
        world_size: Ranks the epoch is split over (rank 0 is read).
        batches: Batches to read (None: rank 0's epoch, at most 2,000).
        label: The member that holds the class (None: the dataset's label, ``.cls`` etc.).
        seed: The loader's seed.
        baseline_samples: Samples drawn through the indexes for the random order's figure when
            less than the whole dataset is read.
        on_error: ``"raise"`` stops at a missing or broken shard; ``"skip"`` skips and counts.
    """

    workers: int = 2
    batch_size: int = 64
    world_size: int = 1
    batches: int | None = None
    label: str | None = None
    seed: int = 0
    baseline_samples: int = 4096
    on_error: OnError = "raise"


def check_mix(
    source: Source,
    options: MixCheckOptions | None = None,
    *,
    stream_options: StreamOptions | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Read labels in the loader's order and measure how mixed its batches are.

    Returns:
        A dict with ``batches``, ``samples``, ``samples_per_s``, ``distinct_per_batch``,
        ``random_distinct_per_batch``, ``distinct_ratio``, ``spearman`` (None without a
        manifest), ``baseline`` (how the random figure was found), ``order`` (the chunk
        size, lanes and piece size used) and ``advice`` (lines).

    Raises:
        ConfigError: The samples have no label (names the members found and ``--label``).

    Examples:
        >>> summary = check_mix("data/train", MixCheckOptions(workers=2))  # doctest: +SKIP
        >>> summary["distinct_ratio"]  # doctest: +SKIP
        0.95
    """
    options = options or MixCheckOptions()
    stream = dataclasses.replace(
        stream_options or StreamOptions(), output="dict", rank=0, world_size=options.world_size
    )
    dataset = StreamingDataset(
        source,
        seed=options.seed,
        decode="raw",
        batch_size=options.batch_size,
        options=stream,
        on_error=options.on_error,
    )
    wanted = options.batches
    if wanted is None:
        wanted = min(len(dataset), DEFAULT_MAX_BATCHES) if dataset.counted else DEFAULT_MAX_BATCHES
    started = time.perf_counter()
    codes: dict[Any, int] = {}  # label value -> small integer, shared with the baseline
    labels = _read_labels(dataset, options, wanted, codes, progress)
    seconds = time.perf_counter() - started
    counts, baseline = _baseline(source, dataset, options, labels, codes)
    distinct = distinct_per_batch(labels)
    random = random_distinct(counts, options.batch_size)
    order = dataset.settings.order if dataset.counted else None
    summary: dict[str, Any] = {
        "batches": len(labels),
        "samples": int(sum(len(batch) for batch in labels)),
        "samples_per_s": sum(len(batch) for batch in labels) / max(seconds, 1e-9),
        "distinct_per_batch": float(distinct.mean()) if len(distinct) else 0.0,
        "random_distinct_per_batch": random,
        "distinct_ratio": float(distinct.mean()) / random if random and len(distinct) else None,
        "spearman": _spearman(dataset, options, len(labels)) if dataset.counted else None,
        "baseline": baseline,
        "order": dataclasses.asdict(order) if order is not None else None,
        "num_classes": int(np.count_nonzero(counts)),
    }
    summary["advice"] = mix_advice(summary, dataset.counted, stream.chunk_size)
    return summary


def _label_of(sample_labels: Any, fields: dict[str, Any], label: str | None) -> list[Any]:
    if label is None:
        return [int(value) for value in sample_labels]
    if label not in fields:
        raise ConfigError(
            f"the samples have no member {label!r}; they have {sorted(fields)}. Pass the "
            "member that holds the class with --label KEY"
        )
    return [bytes(value) if not isinstance(value, (int, str)) else value for value in fields[label]]


def _read_labels(
    dataset: StreamingDataset, options: MixCheckOptions, wanted: int, codes: dict[Any, int],
    progress: Callable[[int], None] | None,
) -> list[np.ndarray]:  # fmt: skip
    """Each batch's labels, as small integers (``codes``), in the loader's order."""
    batches: list[np.ndarray] = []
    loader = StreamingDataLoader(dataset, num_workers=options.workers)
    for batch in loader:
        values = _label_of(batch["label"], batch, options.label)
        if options.label is None and all(value == -1 for value in values):
            members = sorted(key for key in batch if not key.startswith("__"))
            raise ConfigError(
                f"the samples carry no label (no .cls/.label/.class member; they have "
                f"{members}). Pass the member that holds the class with --label KEY"
            )
        batches.append(np.array([codes.setdefault(value, len(codes)) for value in values]))
        if progress is not None:
            progress(len(batches))
        if len(batches) >= wanted:
            break
    return batches


def _baseline(
    source: Source, dataset: StreamingDataset, options: MixCheckOptions,
    labels: list[np.ndarray], codes: dict[Any, int],
) -> tuple[np.ndarray, str]:  # fmt: skip
    """Label counts for the random order's figure, and where they came from."""
    read = np.concatenate(labels) if labels else np.zeros(0, np.int64)
    whole = dataset.counted and options.world_size == 1 and len(read) >= dataset.samples_per_rank()
    if whole or not dataset.counted:
        source = "every sample" if whole else "the samples read (no manifest: a random order"
        source += "" if whole else " would likely mix more than this estimate)"
        return np.bincount(read), source
    drawn = _sampled_counts(source, dataset, options, codes)
    return drawn, f"{int(drawn.sum())} samples drawn at random"


def _sampled_counts(
    source: Source, dataset: StreamingDataset, options: MixCheckOptions, codes: dict[Any, int]
) -> np.ndarray:
    """Label counts of samples drawn uniformly at random through the shards' indexes."""
    from shardstream.streaming._randomaccess import RandomAccessDataset

    sampler = RandomAccessDataset(source, decode="raw", options=dataset.options)
    rng = np.random.default_rng(options.seed)
    count = min(options.baseline_samples, len(sampler))
    found = []
    for position in rng.choice(len(sampler), count, replace=False).tolist():
        sample = sampler[position]
        value = sample["label"] if options.label is None else sample[options.label]
        value = value if isinstance(value, (int, str)) else bytes(value)
        found.append(codes.setdefault(value, len(codes)))
    return np.bincount(found)


def _spearman(dataset: StreamingDataset, options: MixCheckOptions, num_batches: int) -> float:
    """Rank correlation of written position and reading order over the batches read."""
    plan = dataset.plan(PassState(0), dataset.layout(options.workers))
    starts = np.zeros(len(dataset.shards) + 1, dtype=np.int64)
    np.cumsum(dataset.shards.counts(), out=starts[1:])
    written = []
    for number, (shards, ordinals) in enumerate(planned_batches(plan, 0)):
        if number >= num_batches:
            break
        written.append(starts[shards] + ordinals)
    return spearman(np.concatenate(written)) if written else 0.0


def mix_advice(
    summary: dict[str, Any], counted: bool, chunk_size_given: int | None = None
) -> list[str]:
    """What to change when a figure is poor (an empty list when both are fine).

    ``chunk_size_given`` is the user's ``StreamOptions(chunk_size=...)`` (None when left to
    shardstream). The Spearman figure counts as poor only beyond what a random order of as
    many samples gives.
    """
    lines: list[str] = []
    ratio, correlation = summary["distinct_ratio"], summary["spearman"]
    few_classes = ratio is not None and ratio < 0.9
    as_written = correlation is not None and abs(correlation) > _noise(summary["samples"])
    whole_shards = counted and chunk_size_given == 0
    if whole_shards and (few_classes or as_written):
        lines.append(
            "StreamOptions(chunk_size=0) reads whole shards, each in its written order: leave "
            "chunk_size unset (shardstream chooses chunks from the data)"
        )
    if few_classes and not counted:
        lines.append(
            "batches hold fewer classes than a random order's: these shards have no "
            "manifest, so whole shards are read; run `shardstream index` on them for the "
            "chunked order, or use fewer DataLoader workers (each batch comes from one)"
        )
    elif few_classes:
        lines.append(
            "batches hold fewer classes than a random order's: raise StreamOptions(num_open="
            "...) well above the batch size, and keep piece_size small"
            + ("" if whole_shards else " (or leave both, and chunk_size, to shardstream)")
        )
    if as_written and not whole_shards:
        chunk = summary["order"]["chunk_size"] if summary["order"] else None
        lines.append(
            f"the reading order follows the writing order: the epoch is read in chunks of "
            f"{chunk} consecutive samples; pass a smaller StreamOptions(chunk_size=...)"
        )
    return lines


def _noise(num_samples: int) -> float:
    """The Spearman figure a random order stays within (about 3 standard deviations, at
    least 0.1): with few samples read, a random order's figure is far from 0 too."""
    return max(0.1, 3 / math.sqrt(max(1, num_samples - 1)))


def format_mix_report(summary: dict[str, Any]) -> str:
    """A table of the figures against a random permutation's, then the advice."""
    ratio, correlation = summary["distinct_ratio"], summary["spearman"]
    order = summary["order"]
    rows = [
        ("batches read", f"{summary['batches']:,} ({summary['samples']:,} samples)"),
        ("classes", f"{summary['num_classes']:,}"),
        ("distinct classes per batch", f"{summary['distinct_per_batch']:.1f}"),
        ("  random permutation", f"{summary['random_distinct_per_batch']:.1f}"),
        ("  share of random's", "n/a" if ratio is None else f"{ratio:.2f} (aim: >= 0.90)"),
        ("Spearman, written vs read", "n/a (no manifest)" if correlation is None
         else f"{correlation:+.3f} (random: 0; aim: within {_noise(summary['samples']):.2f})"),
        ("samples/s (labels only)", f"{summary['samples_per_s']:,.0f}"),
        ("order", "whole shards, no manifest" if order is None else
         f"chunks of {order['chunk_size']}, {order['num_open']} lanes, pieces of "
         f"{order['piece_size']}"),
        ("random figure from", summary["baseline"]),
    ]  # fmt: skip
    return format_table(rows, summary["advice"] or ["both figures are as good as a random order's"])
