"""Peer loaders for the shuffle-quality benchmark: write the data in each peer's format, then
return the order in which the peer's own loader yields it.

The data is ``N`` tiny samples in *written order* (class order): sample ``i`` holds its written
position ``i``, its label ``y[i]`` and a 16-float feature vector ``x[i]``. Every writer stores
the written position in the sample; every runner drives the peer's real loader (a
``torch.utils.data.DataLoader`` with real worker processes and the peer's own shuffle) for one
epoch and reads the positions back, one array per batch.

Peers:
    webdataset: ``WebDataset(urls, shardshuffle=100, seed=seed).shuffle(buffer, seed=seed)``.
    mosaicml-streaming: ``StreamingDataset(local=..., shuffle=True, shuffle_algo=...)``.
    litdata: ``litdata.StreamingDataset(..., shuffle=True)`` with ``StreamingDataLoader``.

mosaicml-streaming and litdata are imported only inside their functions, so the benchmark runs
without them; :func:`unavailable_reason` says why a peer cannot run.

What the peers do with the epoch (checked at 200 x 1,000 and 20 x 200 samples, 2 workers):
every peer yields each sample exactly once, except mosaic ``py1s``, which pads its epoch to a
multiple of its 64 canonical nodes by repeating samples (4,000 samples: 4,032 yielded; 200,000
divides evenly). webdataset ends each worker's stream with a partial batch; litdata reads one
chunk at a time per worker, so its batches hold about one class.
"""

from __future__ import annotations

import gc
import multiprocessing
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from _peer_runs import (
    SINGLE_RANK_ENV,
    PeerRun,
    check_shard_sizes,
    environment,
    finish_writing,
    is_written,
    iterate,
    read_index,
    start_writing,
    unavailable_reason,
)

# -- webdataset ------------------------------------------------------------------------------


def write_webdataset(x: np.ndarray, y: np.ndarray, folder: str | Path, per_shard: int) -> list[str]:
    """Write tar shards of ``per_shard`` samples: key = written position, ``npy`` + ``cls``."""
    import webdataset as wds

    folder = Path(folder)
    num_shards = -(-len(x) // per_shard)
    urls = [str(folder / f"shard-{index:06d}.tar") for index in range(num_shards)]
    if is_written(folder, len(x), per_shard):
        return urls
    start_writing(folder)
    folder.mkdir()
    pattern = str(folder / "shard-%06d.tar")
    # An integer mtime keeps tarfile from adding a PAX header to every member (float mtime).
    with wds.ShardWriter(pattern, maxcount=per_shard, verbose=0, mtime=0) as sink:
        for position in range(len(x)):
            sink.write({"__key__": f"{position:09d}", "npy": x[position], "cls": int(y[position])})
    finish_writing(folder, len(x), per_shard)
    return urls


def run_webdataset(
    urls: list[str],
    buffer: int,
    *,
    shard_buffer: int = 100,
    batch_size: int = 64,
    num_workers: int = 2,
    seed: int = 0,
) -> PeerRun:
    """One epoch of the documented recipe: shard shuffle, split by worker, sample buffer shuffle.

    ``shard_buffer=100`` is what ``shardshuffle=True`` means. Both shuffles take ``seed``, so
    every worker uses the same seed on its own shards (webdataset's default is pid + time).
    """
    import torch
    import webdataset as wds

    dataset = (
        wds.WebDataset(urls, shardshuffle=shard_buffer, seed=seed)
        .shuffle(buffer, seed=seed)
        .decode()
        .to_tuple("__key__", "npy", "cls")
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=num_workers)
    return iterate(
        f"webdataset (buffer {buffer:,})", loader, lambda batch: [int(key) for key in batch[0]]
    )


# -- mosaicml-streaming ----------------------------------------------------------------------


def write_mosaic(x: np.ndarray, y: np.ndarray, folder: str | Path, per_shard: int) -> str:
    """Write MDS shards of exactly ``per_shard`` samples (columns ``pos``, ``y``, ``x``)."""
    from streaming import MDSWriter

    folder = Path(folder)
    if is_written(folder, len(x), per_shard):
        return str(folder)
    start_writing(folder)
    num_features = x.shape[1]
    columns = {"pos": "int64", "y": "int64", "x": f"ndarray:float32:{num_features}"}
    with MDSWriter(out=str(folder), columns=columns, size_limit=1 << 26) as writer:
        # A shard's size counts its header (which holds the JSON config) and a 4-byte offset
        # per sample; the header's size is known once the writer exists, so set the exact
        # limit here. Every sample takes the same bytes: all columns have a fixed size.
        sample_bytes = 8 + 8 + 4 * num_features + writer.extra_bytes_per_sample
        writer.size_limit = writer.extra_bytes_per_shard + per_shard * sample_bytes
        for position in range(len(x)):
            writer.write({"pos": position, "y": int(y[position]), "x": x[position]})
    shard_sizes = [shard["samples"] for shard in read_index(folder)["shards"]]
    check_shard_sizes(folder, shard_sizes, per_shard)
    finish_writing(folder, len(x), per_shard)
    return str(folder)


def run_mosaic(
    folder: str | Path, algo: str, *, batch_size: int = 64, num_workers: int = 2, seed: int = 0
) -> PeerRun:
    """One epoch of ``StreamingDataset(local=folder, shuffle=True, shuffle_algo=algo)``.

    Other options keep their defaults (``shuffle_block_size``, ``num_canonical_nodes``,
    ``partition_algo``). The dataset registers its folder in shared memory; stale entries from
    earlier runs are cleaned before and after, so runs can repeat in one process.
    """
    import torch
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    with environment(SINGLE_RANK_ENV):
        clean_stale_shared_memory()
        try:
            dataset = StreamingDataset(
                local=str(folder),
                shuffle=True,
                shuffle_algo=algo,
                shuffle_seed=seed,
                batch_size=batch_size,
            )
            loader = torch.utils.data.DataLoader(
                dataset, batch_size=batch_size, num_workers=num_workers
            )
            with warnings.catch_warnings():
                # MDS decodes ``x`` as a read-only view of the shard's bytes; collate only reads
                # it, so torch's warning about non-writable arrays says nothing here. Forked
                # workers inherit this filter.
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                run = iterate(f"mosaic ({algo})", loader, lambda batch: batch["pos"])
            del loader, dataset
        finally:
            gc.collect()  # the dataset's destructor releases its folder's registration
            clean_stale_shared_memory()
    return run


# -- litdata ---------------------------------------------------------------------------------


def _litdata_items(shard: tuple[int, np.ndarray, np.ndarray]) -> Iterator[dict[str, Any]]:
    """``optimize``'s function: the samples of one shard, in written order."""
    start, xs, ys = shard
    for offset in range(len(xs)):
        yield {"pos": start + offset, "y": int(ys[offset]), "x": xs[offset]}


def write_litdata(x: np.ndarray, y: np.ndarray, folder: str | Path, per_shard: int) -> str:
    """``litdata.optimize`` with ``chunk_size=per_shard`` and one worker (keeps written order)."""
    import litdata

    folder = Path(folder)
    if is_written(folder, len(x), per_shard):
        return str(folder)
    start_writing(folder)
    shards = [
        (start, x[start : start + per_shard], y[start : start + per_shard])
        for start in range(0, len(x), per_shard)
    ]
    # optimize() forces the process-wide start method (spawn by default); put it back after.
    start_method = multiprocessing.get_start_method(allow_none=True)
    # optimize() stages chunks in $TMPDIR/chunks and $TMPDIR/data unless told otherwise: use a
    # private folder so that two writes at once cannot mix. It also sets
    # DATA_OPTIMIZER_NUM_WORKERS in this process; listing it here restores it afterwards.
    with tempfile.TemporaryDirectory(prefix="litdata-optimize-") as staging:
        staging_env = {
            "DATA_OPTIMIZER_CACHE_FOLDER": f"{staging}/chunks",
            "DATA_OPTIMIZER_DATA_CACHE_FOLDER": f"{staging}/data",
            "DATA_OPTIMIZER_NUM_WORKERS": "1",
        }
        try:
            with environment({**SINGLE_RANK_ENV, **staging_env}):
                litdata.optimize(
                    fn=_litdata_items,
                    inputs=shards,
                    output_dir=str(folder),
                    chunk_size=per_shard,
                    num_workers=1,
                    keep_data_ordered=True,
                    start_method="fork",
                    verbose=False,
                )
        finally:
            multiprocessing.set_start_method(start_method, force=True)
    chunk_sizes = [chunk["chunk_size"] for chunk in read_index(folder)["chunks"]]
    check_shard_sizes(folder, chunk_sizes, per_shard)
    finish_writing(folder, len(x), per_shard)
    return str(folder)


def run_litdata(
    folder: str | Path, *, batch_size: int = 64, num_workers: int = 2, seed: int = 0
) -> PeerRun:
    """One epoch of ``litdata.StreamingDataset(folder, shuffle=True, seed=seed)``.

    Read through ``litdata.StreamingDataLoader`` (a DataLoader subclass), as litdata's docs
    say. The cache folder is a fresh temporary one per run.
    """
    import litdata

    with (
        environment(SINGLE_RANK_ENV),
        tempfile.TemporaryDirectory(prefix="litdata-cache-") as cache,
    ):
        dataset = litdata.StreamingDataset(str(folder), shuffle=True, seed=seed, cache_dir=cache)
        loader = litdata.StreamingDataLoader(
            dataset, batch_size=batch_size, num_workers=num_workers
        )
        return iterate("litdata", loader, lambda batch: batch["pos"])


# -- all peers -------------------------------------------------------------------------------


def run_peers(
    x: np.ndarray, y: np.ndarray, root: str | Path, per_shard: int, **loader: int
) -> Iterator[tuple[str, PeerRun | str]]:
    """Write every peer's data under ``root`` and run each row: ``(peer, run or skip reason)``.

    ``loader`` is passed to every ``run_*`` function (``batch_size``, ``num_workers``, ``seed``).
    """
    root = Path(root)
    if (reason := unavailable_reason("webdataset")) is None:
        urls = write_webdataset(x, y, root / "webdataset", per_shard)
        for buffer in (1_000, 10_000):
            yield "webdataset", run_webdataset(urls, buffer, **loader)
    else:
        yield "webdataset", reason
    if (reason := unavailable_reason("mosaic")) is None:
        folder = write_mosaic(x, y, root / "mosaic", per_shard)
        for algo in ("py1e", "py1s"):
            yield "mosaic", run_mosaic(folder, algo, **loader)
    else:
        yield "mosaic", reason
    if (reason := unavailable_reason("litdata")) is None:
        yield "litdata", run_litdata(write_litdata(x, y, root / "litdata", per_shard), **loader)
    else:
        yield "litdata", reason


def _smoke_test() -> None:
    """20 classes x 200 samples, shards of 200, every peer with 2 workers."""
    num_classes, per_class = 20, 200
    labels = np.arange(num_classes * per_class, dtype=np.int64) // per_class
    x = np.random.default_rng(0).standard_normal((len(labels), 16), dtype=np.float32)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="shuffle-peers-") as root:
        for peer, run in run_peers(x, labels, root, per_class, num_workers=2, seed=0):
            if isinstance(run, str):
                print(f"{peer:28} skipped: {run}")
                continue
            seen = run.positions()
            distinct = np.mean([len(np.unique(labels[batch])) for batch in run.batches])
            print(
                f"{run.name:28} batches {len(run.batches):3}  seen {len(seen):5}  "
                f"unique {len(np.unique(seen)):5}/{len(labels)}  {run.seconds:5.2f} s  "
                f"workers {run.worker_uss_mb:6.1f} MB  labels/batch {distinct:5.2f}"
            )
    print(f"total {time.perf_counter() - started:.1f} s (writing included)")


if __name__ == "__main__":
    _smoke_test()
