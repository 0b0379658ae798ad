"""Where a raw sample's CPU time goes: each part of the raw path timed alone, in µs per sample.

The raw path (``decode="raw"``) is Python from end to end, so its parts are timed one at a
time on the shards ``benchmarks/load.py`` builds (default: its 5,000-image dataset, every shard
indexed), each the fastest of several repeats of CPU time (``time.process_time``), which is
steadier than wall time on a shared machine:

- tar headers: ``parse_plain_sample`` of every sample, on a fresh memory map of each shard
  (the first touch of a page faults, as in a pass) and again on the same map;
- convert + collate: a raw batch of 64 ``(image, label)`` pairs (``Batcher.finish``);
- window planning: every window of one stream of an epoch (``build_window``), 0 workers;
- a whole epoch without workers (``StreamingDataset`` iterated in this process), for the total.

Compare two versions by running this script with each on ``PYTHONPATH``, in turns.

Usage: python benchmarks/load.py --num-images 5000 --num-classes 50 --modes raw --workers 0
       python benchmarks/raw_path.py [bench-data/load-shards-5000-50] [--repeat 5]
"""

from __future__ import annotations

import argparse
import itertools
import mmap
import sys
import time
import timeit
from pathlib import Path

import numpy as np

from shardstream._format.shardindex import decode_index
from shardstream._format.tarreader import parse_plain_sample
from shardstream.streaming import StreamingDataset
from shardstream.streaming._decoding.decode import SampleConverter
from shardstream.streaming._planning.order import (
    DatasetFacts,
    PlanOptions,
    choose_order,
    epoch_sequence,
)
from shardstream.streaming._planning.split import Layout, PassPlan, Shape
from shardstream.streaming._planning.windows import StreamId, StreamLanes, build_window
from shardstream.streaming._worker.batch import collate_pairs
from shardstream.streaming._worker.pipeline import Batcher
from shardstream.streaming._worker.reader import WorkerStats

BATCH = 64


def offsets_of(shard: Path) -> list[int]:
    index = decode_index(shard.with_suffix(".idx").read_bytes(), str(shard))
    return [int(offset) for offset in index.offsets]


def time_headers(shards: list[Path], repeat: int) -> tuple[float, float]:
    """µs per sample of parsing every sample's headers: on a fresh map, then on touched pages."""
    fresh, touched = [], []
    for _ in range(repeat):
        first = again = 0.0
        count = 0
        for shard in shards:
            offsets = offsets_of(shard)
            with open(shard, "rb") as stream:
                mapping = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_COPY)
                view = memoryview(mapping)
                for number in range(2):
                    started = time.process_time()
                    for here, after in itertools.pairwise(offsets):
                        parse_plain_sample(view[here:after], shard.name, here)
                    spent = time.process_time() - started
                    first, again = (first + spent, again) if number == 0 else (first, again + spent)
                del view
                mapping.close()
            count += len(offsets) - 1
        fresh.append(first / count * 1e6)
        touched.append(again / count * 1e6)
    return min(fresh), min(touched)


def time_batches(shard: Path, repeat: int) -> float:
    """µs per sample of converting and collating raw batches of (image, label) pairs."""
    offsets = offsets_of(shard)[: 10 * BATCH + 1]
    view = memoryview(bytearray(shard.read_bytes()[: offsets[-1]]))
    samples = [parse_plain_sample(view[a:b], shard.name, a) for a, b in itertools.pairwise(offsets)]
    batches = [samples[start : start + BATCH] for start in range(0, len(samples), BATCH)]
    batcher = Batcher(SampleConverter("raw", batched=True), BATCH, collate_pairs)
    stats = WorkerStats()

    def finish() -> None:
        for batch in batches:
            batcher.finish(batch, stats)

    spent = min(timeit.repeat(finish, number=10, repeat=repeat, timer=time.process_time))
    return spent / 10 / len(samples) * 1e6


def time_windows(shards: list[Path], repeat: int) -> float:
    """µs per sample of building every window of an epoch's one stream (0 workers)."""
    counts = np.array([len(offsets_of(shard)) - 1 for shard in shards])
    order = choose_order(DatasetFacts(indexed=True, local=True, mean_sample_bytes=7e4))
    options = PlanOptions(
        seed=0, chunk_size=order.chunk_size, num_open=order.num_open,
        piece_size=order.piece_size, block_size=order.block_size,
    )  # fmt: skip
    sequence = epoch_sequence(counts, 0, 1, options)
    shape = Shape.of(sequence.length, Layout(1, 1, BATCH), options)
    plan = PassPlan(sequence, shape, options, 1, 0)
    stream, lanes = StreamId(1, 0, 0, 0), StreamLanes(shape, 0)

    def build() -> None:
        window = 0
        while lanes.before(window) < lanes.total:
            build_window(plan.sequence, shape, options, stream, window)
            window += 1

    spent = min(timeit.repeat(build, number=3, repeat=repeat, timer=time.process_time))
    return spent / 3 / lanes.total * 1e6


def time_epoch(root: Path, repeat: int) -> float:
    """µs per sample of whole raw epochs without workers (the first, warming up, left out)."""
    dataset = StreamingDataset(str(root), decode="raw", batch_size=BATCH)
    best = float("inf")
    for epoch in range(repeat + 1):
        dataset.set_epoch(epoch)
        started, count = time.process_time(), 0
        for _, labels in dataset:
            count += len(labels)
        if epoch:
            best = min(best, (time.process_time() - started) / count * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default="bench-data/load-shards-5000-50")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    root = Path(args.root)
    shards = sorted(root.glob("shard-*.tar"))
    if not shards or not all(shard.with_suffix(".idx").exists() for shard in shards):
        sys.exit(f"{root}: no indexed shards; build them with benchmarks/load.py (see --help)")
    import torch

    torch.set_num_threads(1)  # as in a DataLoader worker
    first, again = time_headers(shards, args.repeat)
    rows = [
        ("tar headers, first touch of the map", first),
        ("tar headers, pages already touched", again),
        ("convert + collate (Batcher.finish)", time_batches(shards[0], args.repeat)),
        ("window planning (build_window)", time_windows(shards, args.repeat)),
        ("whole epoch, 0 workers", time_epoch(root, args.repeat)),
    ]
    print("| part of the raw path | CPU µs per sample |\n|---|---:|")
    for name, value in rows:
        print(f"| {name} | {value:.2f} |")


if __name__ == "__main__":
    main()
