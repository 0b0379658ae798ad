"""Shuffle quality: does a loader's order train as well as a random permutation?

The data is the case a buffer shuffle gets wrong: ``--classes`` x ``--per-class`` samples (default
200 x 1,000), each a 16-float vector drawn around its class's mean, written in class order with
``--per-shard`` samples per shard (default 1,000: one class per shard), as per-class tars or a
``for label in labels`` writer leave them. Every row runs the loader's real DataLoader (2 worker
processes unless the row says otherwise) for one epoch, batch 64, and reads back each sample's
written position. Figures, each the mean over ``--seeds`` loader seeds:

- distinct classes per batch, as a share of a uniformly random permutation's (exact expectation);
- Spearman correlation between a sample's written position and its read position (random: 0);
- test accuracy of a linear model trained by one epoch of SGD in the loader's order (the same
  model, learning rate and initialisation for every row), on held-out samples;
- samples/s of the epoch (worker start included) and the workers' peak private memory (USS).

Rows: a random permutation and no shuffle (computed, no loader), shardstream with its defaults
(also at 0 and 8 workers, at 4 ranks x 2 workers with every rank's batches, for a two-dataset
mixture, and on the same shards without a manifest), shardstream tuned (more lanes), shardstream
with the whole-shard order, the remote order's numbers applied to the shards on disk
(1 rank, and 4 ranks x 2 workers), the same shards read from a real HTTP server (the project's
Range-capable one on 127.0.0.1, ``_shuffle_remote.py``) with the defaults, so the loader picks
its remote order itself (1 rank, and 4 ranks x 2 workers), and at 4 x 2 with the guide's short
reads for small datasets, with the shard GETs the server answered and their mean size (measured
at the server), webdataset with 1,000- and
10,000-sample buffers, mosaic-streaming (py1e, its default, and py1s) and litdata
(``shuffle=True``). Peers that are not installed are skipped with a note:
``pip install mosaicml-streaming litdata``.

Usage: python benchmarks/shuffle.py [--classes 200] [--per-class 1000] [--seeds 3] [--rows ...]

The remote rows alone (with the random permutation every ratio needs):
python benchmarks/shuffle.py --rows random "shardstream, remote"
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _data import DATA_ROOT
from _peer_runs import PeerRun, iterate
from _shuffle_peers import run_peers
from _shuffle_remote import remote_runs

BATCH = 64
FEATURES = 16
#: The spread of the class means against the unit noise: one epoch of SGD on a random order
#: reaches about 0.3 test accuracy (hard enough that a worse order shows).
MEAN_SCALE = 0.62
WHOLE_SHARDS = {"chunk_size": 0, "num_open": 64, "piece_size": 64}


def make_data(classes: int, per_class: int) -> tuple[np.ndarray, ...]:
    """Training samples in class order, and a held-out test set (100 per class)."""
    rng = np.random.default_rng(1234)
    means = rng.standard_normal((classes, FEATURES)).astype(np.float32) * MEAN_SCALE

    def draw(count: int) -> tuple[np.ndarray, np.ndarray]:
        labels = np.repeat(np.arange(classes), count)
        noise = rng.standard_normal((len(labels), FEATURES), dtype=np.float32)
        return means[labels] + noise, labels

    x, y = draw(per_class)
    x_test, y_test = draw(100)
    return x, y, x_test, y_test


def write_shardstream(
    x: np.ndarray, y: np.ndarray, dest: Path, per_shard: int, first: int = 0
) -> None:
    """Samples ``{__key__: written position, bin: features, cls: label}`` in written order."""
    from shardstream import build_shards

    if (dest / "manifest.json").exists():
        return
    samples = (
        {"__key__": f"{first + i:08d}", "bin": x[i].tobytes(), "cls": int(y[i])}
        for i in range(len(y))
    )
    build_shards(samples, dest, max_samples_per_shard=per_shard, workers=1)


def run_shardstream(name: str, source: object, seed: int, workers: int = 2, world: int = 1,
                    **options: object) -> PeerRun:  # fmt: skip
    """One epoch, timed and measured as the peers' (``iterate``); with ``world`` > 1 every
    rank's loader in turn, their batches merged step by step."""
    from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions

    extra = {"epoch_size": options.pop("epoch_size")} if "epoch_size" in options else {}
    runs = []
    for rank in range(world):
        stream = StreamOptions(output="dict", rank=rank, world_size=world, **options)  # type: ignore[arg-type]
        dataset = StreamingDataset(source, seed=seed, decode="raw", batch_size=BATCH,  # type: ignore[arg-type]
                                   options=stream, **extra)  # fmt: skip
        loader = StreamingDataLoader(dataset, num_workers=workers)
        runs.append(iterate(name, loader, lambda batch: [int(key) for key in batch["__key__"]]))
    batches = [run.batches[step] for step in range(len(runs[0].batches)) for run in runs]
    return PeerRun(name, batches, sum(run.seconds for run in runs),
                   max(run.worker_uss_mb for run in runs))  # fmt: skip


def train_accuracy(order: np.ndarray, data: tuple[np.ndarray, ...], seed: int) -> float:
    """Test accuracy after one epoch of SGD (batch 64) over the samples in ``order``."""
    import torch

    x, y, x_test, y_test = data
    torch.manual_seed(seed)
    model = torch.nn.Linear(FEATURES, int(y.max()) + 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    features, labels = torch.from_numpy(x), torch.from_numpy(y)
    for start in range(0, len(order), BATCH):
        batch = torch.from_numpy(order[start : start + BATCH])
        loss = torch.nn.functional.cross_entropy(model(features[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        predicted = model(torch.from_numpy(x_test)).argmax(1).numpy()
    return float((predicted == y_test).mean())


def figures(run: PeerRun, data: tuple[np.ndarray, ...], seed: int) -> dict[str, float]:
    from shardstream.streaming._diagnostics.mixcheck import (
        distinct_per_batch,
        random_distinct,
        spearman,
    )

    y = data[1]
    order = run.positions()
    random = random_distinct(np.bincount(y), BATCH)
    return {
        "distinct": float(distinct_per_batch([y[b] for b in run.batches]).mean()) / random,
        "spearman": spearman(order),
        "accuracy": train_accuracy(order, data, seed),
        "samples_s": len(order) / run.seconds if run.seconds else float("nan"),
        "memory_mb": run.worker_uss_mb,
        "exact": float(len(order) == len(y) and len(np.unique(order)) == len(y)),
        "gets": run.requests[0] if run.requests else float("nan"),
        "get_mib": run.requests[1] / 2**20 if run.requests else float("nan"),
        "other_requests": run.requests[2] if run.requests else float("nan"),
    }


def computed_rows(data: tuple[np.ndarray, ...], seed: int) -> list[PeerRun]:
    count = len(data[1])
    permutation = np.random.default_rng(seed).permutation(count)
    in_order = np.arange(count)
    chop = lambda order: [order[i : i + BATCH] for i in range(0, count, BATCH)]  # noqa: E731
    return [PeerRun("random permutation", chop(permutation), 0.0, 0.0),
            PeerRun("no shuffle", chop(in_order), 0.0, 0.0)]  # fmt: skip


def remote_order(dest: Path) -> dict[str, int]:
    """The order's numbers shardstream picks for these shards on an object store, as options:
    the same epoch order, read from disk (what a remote read adds is measured in
    benchmarks/stores.py)."""
    from shardstream._catalog import resolve_source
    from shardstream.streaming._planning.order import choose_order

    facts = resolve_source(str(dest))[1].facts()
    remote = dataclasses.replace(facts, local=False)
    choice = choose_order(remote, batch_size=BATCH)
    return {"chunk_size": choice.chunk_size, "num_open": choice.num_open,
            "piece_size": choice.piece_size, "block_size": choice.block_size}  # fmt: skip


def shardstream_rows(root: Path, data: tuple[np.ndarray, ...], per_shard: int, seed: int):  # type: ignore[no-untyped-def]
    """``(name, run)`` of every shardstream row; ``run()`` reads one epoch."""
    from shardstream.streaming import Stream

    x, y = data[0], data[1]
    dest = root / "shardstream"
    write_shardstream(x, y, dest, per_shard)
    half = len(y) // 2
    write_shardstream(x[:half], y[:half], root / "part-a", per_shard)
    write_shardstream(x[half:], y[half:], root / "part-b", per_shard, first=half)
    pattern = str(dest / f"shard-{{000000..{len(y) // per_shard - 1:06d}}}.tar")
    mixture = [Stream(str(root / part), proportion=0.5) for part in ("part-a", "part-b")]
    rows = [
        ("shardstream (defaults)", dest, {}),
        ("shardstream, 0 workers", dest, {"workers": 0}),
        ("shardstream, 8 workers", dest, {"workers": 8}),
        ("shardstream, 4 ranks x 2 workers", dest, {"world": 4}),
        ("shardstream, mixture of 2 datasets", mixture, {"epoch_size": len(y)}),
        ("shardstream, no manifest", pattern, {}),
        ("shardstream tuned (num_open=2048, piece_size=4)", dest,
         {"num_open": 2048, "piece_size": 4}),
        ("shardstream, whole-shard order", dest, WHOLE_SHARDS),
        ("shardstream, remote order (read from disk)", dest, remote_order(dest)),
        ("shardstream, remote order, 4 ranks x 2 workers", dest,
         {**remote_order(dest), "world": 4}),
    ]  # fmt: skip
    for name, source, options in rows:
        yield name, lambda n=name, s=source, o=options: run_shardstream(n, s, seed, **dict(o))


def all_rows(root: Path, data: tuple[np.ndarray, ...], args: argparse.Namespace, seed: int):  # type: ignore[no-untyped-def]
    """Every wanted row's epoch (a PeerRun), or a line saying why a peer was skipped."""

    def wanted(name: str) -> bool:
        return not args.rows or any(name.startswith(prefix) for prefix in args.rows)

    yield from (run for run in computed_rows(data, seed) if wanted(run.name))
    for name, run in shardstream_rows(root, data, args.per_shard, seed):
        if wanted(name):
            yield run()
    yield from remote_runs(run_shardstream, root, seed, wanted)
    if not any(wanted(peer) for peer in ("webdataset", "mosaic", "litdata")):
        return
    peers = run_peers(data[0], data[1], root / "peers", args.per_shard,
                      num_workers=args.workers, seed=seed, batch_size=BATCH)  # fmt: skip
    for peer, result in peers:
        if isinstance(result, str):
            yield f"{peer}: skipped ({result})"
        elif wanted(result.name):
            yield result


def print_table(results: dict[str, list[dict[str, float]]], notes: list[str]) -> None:
    random = np.mean([r["accuracy"] for r in results["random permutation"]])
    print(
        "| order | distinct classes/batch vs random | Spearman | accuracy (vs random) "
        "| samples/s | worker MB | exact epoch | shard GETs x mean size (other requests) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, runs in results.items():
        mean = {key: float(np.mean([run[key] for run in runs])) for key in runs[0]}
        speed = "-" if not np.isfinite(mean["samples_s"]) else f"{mean['samples_s']:,.0f}"
        gets = "-"
        if np.isfinite(mean["gets"]):
            other = mean["other_requests"]
            gets = f"{mean['gets']:,.0f} x {mean['get_mib']:.2f} MiB ({other:,.0f})"
        print(f"| {name} | {mean['distinct']:.2f} | {mean['spearman']:+.3f} | "
              f"{mean['accuracy']:.3f} ({mean['accuracy'] - random:+.3f}) | {speed} | "
              f"{max(run['memory_mb'] for run in runs):.0f} | "
              f"{'yes' if min(run['exact'] for run in runs) else 'no'} | {gets} |")  # fmt: skip
    for note in notes:
        print(f"- {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=int, default=200, help="classes (200)")
    parser.add_argument("--per-class", type=int, default=1000, help="samples per class (1000)")
    parser.add_argument("--per-shard", type=int, default=1000, help="samples per shard (1000)")
    parser.add_argument("--seeds", type=int, default=3, help="loader seeds, averaged (3)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers of the peers")
    parser.add_argument("--rows", nargs="+", help="only rows whose name starts with these")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    data = make_data(args.classes, args.per_class)
    root = DATA_ROOT / f"shuffle-{args.classes}-{args.per_class}-{args.per_shard}"
    results: dict[str, list[dict[str, float]]] = {}
    notes: list[str] = []
    started = time.perf_counter()
    for seed in range(args.seeds):
        for run in all_rows(root, data, args, seed):
            if isinstance(run, str):
                notes += [] if run in notes else [run]
                continue
            results.setdefault(run.name, []).append(figures(run, data, seed))
            print(f"  seed {seed}: {run.name}: {results[run.name][-1]}", file=sys.stderr)
    print(f"\n{args.classes} classes x {args.per_class} samples in class order, "
          f"{args.per_shard} per shard, batch {BATCH}, {args.seeds} seeds, "
          f"{time.perf_counter() - started:.0f} s\n")  # fmt: skip
    print_table(results, notes)


if __name__ == "__main__":
    main()
