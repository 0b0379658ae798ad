"""Builds spread over separate processes (as Spark, Ray or SLURM tasks run them): each writes
its partition, a retry replaces only its own shards, and the merge equals one build."""

from __future__ import annotations

import collections
import pathlib
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from shardstream import (
    ConfigError,
    ManifestNotFoundError,
    StreamingDataLoader,
    StreamingDataset,
    StreamOptions,
    build_shards,
    merge_partitions,
    read_manifest,
)
from shardstream._format.verify import verify_dataset
from tests.streaming.shards import keys_of, make_samples

PER_PARTITION = 40
PER_SHARD = 8  # partitions end on shard boundaries, so one build cuts the same shards

#: One partition task in its own interpreter: partition N writes samples N*40 .. N*40+39;
#: with FAIL_AT it dies after that many samples, as a killed task would.
TASK = textwrap.dedent(
    """
    import os, sys
    from shardstream import write_partition
    from tests.streaming.shards import make_samples

    dest, partition, fail_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    samples = make_samples(3 * {per})[partition * {per}:(partition + 1) * {per}]

    def stream():
        for number, sample in enumerate(samples):
            if number == fail_at:
                os._exit(9)
            yield sample

    write_partition(stream(), dest, partition, max_samples_per_shard={shard})
    """
).format(per=PER_PARTITION, shard=PER_SHARD)


def _run_task(dest: pathlib.Path, partition: int, fail_at: int = -1) -> int:
    root = pathlib.Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", TASK, str(dest), str(partition), str(fail_at)],
        cwd=root, timeout=120, check=False,
    )  # fmt: skip
    return done.returncode


def test_partitions_from_separate_processes_merge_into_one_build(tmp_path: pathlib.Path) -> None:
    dest = tmp_path / "merged"
    assert _run_task(dest, 0) == 0
    assert _run_task(dest, 2) == 0
    assert _run_task(dest, 1, fail_at=21) == 9  # killed half-way: no manifest in part-00001
    with pytest.raises(ManifestNotFoundError, match="part-00001"):
        merge_partitions(dest)
    assert _run_task(dest, 1) == 0  # the retry replaces its own shards
    merged = merge_partitions(dest)

    single = build_shards(make_samples(3 * PER_PARTITION), tmp_path / "single",
                          max_samples_per_shard=PER_SHARD)  # fmt: skip
    assert merged.num_samples == single.num_samples == 3 * PER_PARTITION
    assert list(merged.shards.num_samples) == list(single.shards.num_samples)
    assert [s.sha256 for s in merged.shards] == [s.sha256 for s in single.shards]
    assert merged.shards[5].name == "part-00001/shard-000000.tar"
    assert read_manifest(dest) == merged and verify_dataset(dest) == merged

    ds = StreamingDataset(dest, batch_size=7, options=StreamOptions(output="dict"))
    keys = keys_of(StreamingDataLoader(ds, num_workers=2))
    assert collections.Counter(keys) == collections.Counter(f"s{i:06d}" for i in range(120))


def test_gaps_and_disagreeing_class_names_are_refused(tmp_path: pathlib.Path) -> None:
    from shardstream import write_partition

    samples = make_samples(6)
    write_partition(samples[:3], tmp_path / "gap", 0)
    write_partition(samples[3:], tmp_path / "gap", 2)
    with pytest.raises(ConfigError, match="part-00001"):
        merge_partitions(tmp_path / "gap")
    with pytest.raises(ManifestNotFoundError, match="part-00001"):
        merge_partitions(tmp_path / "gap", num_partitions=3)
    with pytest.raises(ConfigError, match="holds no partitions"):
        merge_partitions(tmp_path / "empty")


def _write_block(batch: dict[str, Any], dest: str) -> dict[str, list[int]]:
    """A Ray Data ``map_batches`` function: one block is one partition (its ``part`` column)."""
    from shardstream import write_partition

    partition = int(batch["part"][0])
    assert all(int(part) == partition for part in batch["part"])
    samples = (
        {"__key__": str(key), "bin": bytes(blob), "cls": int(label)}
        for key, blob, label in zip(batch["key"], batch["bin"], batch["label"], strict=True)
    )
    manifest = write_partition(samples, dest, partition, max_samples_per_shard=PER_SHARD)
    return {"part": [partition], "samples": [manifest.num_samples]}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context")  # Ray's own
def test_ray_data_map_batches_writes_partitions_that_merge(tmp_path: pathlib.Path) -> None:
    import ray
    import ray.data

    rows = [{"part": i // PER_PARTITION, "key": f"r{i:05d}", "bin": bytes([i % 251]) * (i + 1),
             "label": i % 3} for i in range(3 * PER_PARTITION)]  # fmt: skip
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        blocks = ray.data.from_items(rows, override_num_blocks=3)  # a block is a partition
        written = blocks.map_batches(
            _write_block, batch_size=None, fn_kwargs={"dest": str(tmp_path / "ray")}
        )
        reports = sorted((row["part"], row["samples"]) for row in written.take_all())
    finally:
        ray.shutdown()
    assert reports == [(0, PER_PARTITION), (1, PER_PARTITION), (2, PER_PARTITION)]
    merged = merge_partitions(tmp_path / "ray")
    single = build_shards(
        ({"__key__": r["key"], "bin": r["bin"], "cls": r["label"]} for r in rows),
        tmp_path / "single",
        max_samples_per_shard=PER_SHARD,
    )
    assert [s.sha256 for s in merged.shards] == [s.sha256 for s in single.shards]
    assert verify_dataset(tmp_path / "ray") == merged
