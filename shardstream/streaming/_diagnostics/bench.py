"""``shardstream bench``: run the loader on the user's own data and say where the time goes.

:func:`run_bench` streams a dataset (local or any fsspec URL) through ``StreamingDataLoader``
with loader statistics on, with a standard train transform (RandomResizedCrop 224 + flip +
normalize) or raw bytes, for a number of batches or seconds, and returns the statistics with
advice: what to change when one part dominates. :func:`format_report` prints them as a table.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

from shardstream._catalog.shardlist import Source
from shardstream.errors import ConfigError
from shardstream.streaming._dataset import StreamingDataset
from shardstream.streaming._diagnostics.stats import bottleneck
from shardstream.streaming._loader import StreamingDataLoader
from shardstream.streaming._options import OnError, StreamOptions

__all__ = [
    "BenchOptions",
    "advice",
    "format_report",
    "format_table",
    "run_bench",
    "train_transform",
]

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """What :func:`run_bench` runs.

    Attributes:
        workers: DataLoader workers.
        batch_size: Samples per batch.
        mode: ``"train"`` (decode + the standard train transform) or ``"raw"`` (bytes).
        batches: Stop after this many batches (None: a whole epoch, or ``seconds``).
        seconds: Stop after about this long (None: no limit).
        warmup_batches: Batches read before measuring (worker start-up, first reads).
        on_error: ``"raise"`` stops at a missing or broken shard or sample; ``"skip"`` skips
            and counts them (as ``StreamingDataset(on_error=...)``).
    """

    workers: int = 2
    batch_size: int = 64
    mode: str = "train"
    batches: int | None = None
    seconds: float | None = 30.0
    warmup_batches: int = 2
    on_error: OnError = "raise"

    def __post_init__(self) -> None:
        if self.mode not in ("train", "raw"):
            raise ConfigError(f"mode must be 'train' or 'raw', got {self.mode!r}")
        if self.on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")
        if self.workers < 0 or self.batch_size < 1:
            raise ConfigError("workers must be 0 or more and batch_size 1 or more")


def train_transform() -> Callable[[Any], Any]:
    """RandomResizedCrop(224) + horizontal flip + float tensor + ImageNet normalization."""
    import torch
    from torchvision.transforms import v2

    return v2.Compose([
        v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(), v2.PILToTensor(),
        v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD),
    ])  # fmt: skip


def run_bench(
    source: Source,
    options: BenchOptions | None = None,
    *,
    stream_options: StreamOptions | None = None,
    transform: Callable[[Any], Any] | None = None,
    consumer: Callable[[Any], None] | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Stream ``source`` and return the loader statistics of the measured batches plus
    ``"advice"`` (a list of lines) and ``"settings"``.

    Args:
        source: A dataset folder or URL, a shard pattern or a list, as for StreamingDataset.
        options: Workers, batch size, mode and length.
        stream_options: Storage and read options (statistics are turned on here).
        transform: Replaces the standard train transform (``mode="train"``).
        consumer: Called with each batch, as a training step would be (default: nothing).
        progress: Called with the number of batches read so far.
    """
    options = options or BenchOptions()
    stream = dataclasses.replace(stream_options or StreamOptions(), stats=True)
    train = options.mode == "train"
    dataset = StreamingDataset(
        source, batch_size=options.batch_size, decode="pil" if train else "raw",
        transform=(transform or train_transform()) if train else None, options=stream,
        on_error=options.on_error,
    )  # fmt: skip
    loader = StreamingDataLoader(dataset, num_workers=options.workers)
    iterator = iter(loader)
    for _ in range(options.warmup_batches):
        if next(iterator, None) is None:
            break
    before = loader.stats()
    started = time.perf_counter()
    for read, batch in enumerate(iterator, start=1):
        if consumer is not None:
            consumer(batch)
        if progress is not None:
            progress(read)
        if options.batches is not None and read >= options.batches:
            break
        if options.seconds is not None and time.perf_counter() - started >= options.seconds:
            break
    summary = _difference(loader.stats(), before)
    del iterator
    summary["settings"] = dataclasses.asdict(options)
    summary["advice"] = advice(summary, options)
    return summary


def _difference(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """The statistics of what was read between two snapshots (the warm-up left out)."""
    summary = dict(after)
    for key in ("wall_s", "batches", "samples", "wait_s", "step_s", "bytes", "skipped",
                "retries", "read_samples"):  # fmt: skip
        summary[key] = (after[key] or 0) - (before[key] or 0)
    summary["stages_s"] = {k: v - before["stages_s"][k] for k, v in after["stages_s"].items()}
    wall = summary["wall_s"]
    summary["samples_per_s"] = summary["samples"] / wall if wall > 0 else 0.0
    summary["stall_share"] = summary["wait_s"] / wall if wall > 0 else None
    summary.pop("passes", None)
    summary["bottleneck"] = bottleneck(summary["stages_s"], summary["stall_share"])
    return summary


_ADVICE = {
    "storage": "reading dominates: for object stores raise ReadOptions.read_ahead_bytes and "
    "StreamOptions(piece_size=...), cache shards on local disk (ReadOptions(cache_dir=...)), "
    "or add workers to hide latency",
    "decode": "decoding dominates: add workers, install the `fastjpeg` extra (decodes only the "
    "RandomResizedCrop window), or store smaller images (`shardstream build --resize`)",
    "transform": "the transform dominates: add workers, make the transform lighter, or move "
    "augmentation to the GPU",
    "collate": "collating dominates: keep batches as tensors of one shape (fixed-size "
    "transforms) and StreamOptions(batch_buffers=...) at its default",
    "consumer": "the loader keeps up: the training step, not the data, sets the pace",
}


def advice(summary: dict[str, Any], options: BenchOptions) -> list[str]:
    """What to change, given where the time went."""
    lines = [_ADVICE[summary["bottleneck"]]]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if summary["bottleneck"] != "consumer" and cores and options.workers < cores:
        lines.append(
            f"this machine has {cores} cores and the loader used {options.workers} workers: "
            f"try --workers {cores}"
        )
    if summary["skipped"]:
        lines.append(f"{summary['skipped']} samples were skipped: run `shardstream verify`")
    return lines


def format_report(summary: dict[str, Any]) -> str:
    """A table of throughput and where the workers' time went, then the advice."""
    stages = summary["stages_s"]
    busy = sum(stages.values()) or 1.0
    stall = summary["stall_share"]
    rows = [
        ("samples/s", f"{summary['samples_per_s']:,.0f}"),
        ("MB/s read", f"{summary['bytes'] / 1e6 / max(summary['wall_s'], 1e-9):,.1f}"),
        ("batches", f"{summary['batches']}"),
        ("wall", f"{summary['wall_s']:.2f} s"),
        ("data stall (loop waiting)", "n/a" if stall is None else f"{100 * stall:.0f}%"),
        *(
            (f"worker time: {stage}", f"{seconds:.2f} s ({100 * seconds / busy:.0f}%)")
            for stage, seconds in stages.items()
        ),
        ("storage retries", f"{summary['retries']}"),
        ("skipped samples", f"{summary['skipped']}"),
        ("bottleneck", summary["bottleneck"]),
    ]
    return format_table(rows, summary["advice"])


def format_table(rows: list[tuple[str, str]], advice: list[str]) -> str:
    """``(measure, value)`` rows as a Markdown table, then the advice as a list."""
    width = max(len(name) for name, _ in rows)
    lines = [f"| {'measure'.ljust(width)} | value |", f"|{'-' * (width + 2)}|-------|"]
    lines += [f"| {name.ljust(width)} | {value} |" for name, value in rows]
    return "\n".join(lines + [""] + [f"- {line}" for line in advice])
