"""An indexed gzipped shard made by another tool (like webdataset's testdata/sample.tgz, 90
samples) is shuffled: a different order per seed and epoch, every sample once, and
``bench --shuffle`` gives advice that fits it.

Gzipped shards have counts but no byte index, and used to be read as whole shards in their
written order: one shard came out in nearly the same order for every seed and epoch.
"""

from __future__ import annotations

import io
import pathlib
import tarfile

import numpy as np
import pytest

from shardstream import index_shards
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from shardstream.streaming._diagnostics.mixcheck import MixCheckOptions, check_mix, spearman
from tests.streaming.shards import tiny_jpeg

NUM = 90


@pytest.fixture(scope="module")
def sample_tgz(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """One ``sample.tgz`` of 90 samples (jpg + cls, classes in runs as written), indexed."""
    root = tmp_path_factory.mktemp("foreign")
    with tarfile.open(root / "sample.tgz", "w:gz") as tar:
        for number in range(NUM):
            members = {"jpg": tiny_jpeg(number % 16), "cls": str(number // 9).encode()}
            for extension, data in members.items():
                info = tarfile.TarInfo(f"sample{number:03d}.{extension}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    index_shards(root)
    return root


def _order(root: pathlib.Path, seed: int, epoch: int = 0) -> list[int]:
    dataset = StreamingDataset(root, seed=seed, decode="raw", options=StreamOptions(output="dict"))
    dataset.set_epoch(epoch)
    return [int(sample["__key__"][6:]) for sample in dataset]


def test_an_indexed_gzipped_shard_is_shuffled_per_seed_and_epoch(sample_tgz: pathlib.Path) -> None:
    orders = [_order(sample_tgz, seed) for seed in range(5)]
    orders.append(_order(sample_tgz, 0, epoch=1))
    assert all(sorted(order) == list(range(NUM)) for order in orders)  # every sample once
    assert len({tuple(order) for order in orders}) == len(orders)
    assert len({tuple(order[:10]) for order in orders}) == len(orders)  # not just the tail
    # As mixed as a random permutation of 90 (whose |Spearman| averages about 0.085); whole
    # shards in their written order gave 0.5 to 0.7.
    correlations = [abs(spearman(np.array(order))) for order in orders]
    assert float(np.mean(correlations)) < 0.25, correlations


def test_the_shuffled_epoch_stays_exact_with_workers(sample_tgz: pathlib.Path) -> None:
    dataset = StreamingDataset(
        sample_tgz, seed=3, decode="raw", batch_size=8, options=StreamOptions(output="dict")
    )
    keys = [
        key for batch in StreamingDataLoader(dataset, num_workers=2) for key in batch["__key__"]
    ]
    assert sorted(keys) == [f"sample{number:03d}" for number in range(NUM)]
    assert keys != sorted(keys)


def test_bench_shuffle_advice_fits_the_order_it_measured(sample_tgz: pathlib.Path) -> None:
    options = MixCheckOptions(workers=2, batch_size=8)
    summary = check_mix(sample_tgz, options)
    assert summary["order"]["chunk_size"] > 0  # chosen for the data, not whole shards
    assert not any("writing order" in line for line in summary["advice"]), summary
    # Whole shards asked for: the advice names that setting, and nothing that is already so.
    poor = StreamOptions(chunk_size=0, piece_size=64)
    whole = check_mix(sample_tgz, options, stream_options=poor)
    assert whole["distinct_ratio"] < 0.9
    (said,) = [line for line in whole["advice"] if "chunk_size" in line]
    assert "chunk_size=0" in said and "leave chunk_size unset" in said
    assert not any("shuffle=True" in line or ".idx" in line for line in whole["advice"])
