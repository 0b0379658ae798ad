"""A real 2-rank (gloo) x 2-worker job restarted after the dataset grew under it."""

from __future__ import annotations

import collections
import pathlib

import pytest

from shardstream._catalog.versions import read_version
from shardstream._format.manifest import read_manifest
from shardstream._storage import Store
from shardstream.shardwriter import build_shards
from tests.shardwriter.growth import write_day
from tests.streaming.restarts import run_phase

BUILD = {"max_samples_per_shard": 3}


@pytest.mark.slow
def test_ranks_finish_the_old_version_then_read_the_new_one(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "ds"
    build_shards(write_day(tmp_path / "day1", 1, per_class=12), root, **BUILD)  # 24 samples
    before = run_phase(tmp_path, root, "before", seed=2, batches=2)
    build_shards(write_day(tmp_path / "day2", 2, per_class=5), root, append=True, **BUILD)
    after = run_phase(tmp_path, root, "after", seed=2, batches=2)
    old = {sample.name for sample in read_version(Store(str(root)), 1).shards}
    assert len(old) == 8 and read_manifest(str(root)).num_samples == 34
    rest_counts = {len(result["rest"]) for result in after}
    assert rest_counts == {after[0]["rest_max"]} == {8}  # equal: (24 - 2 * 4) / 2 per rank
    epoch = collections.Counter(
        key for b, a in zip(before, after, strict=True) for key in b["consumed"] + a["rest"]
    )
    assert len(epoch) == 24 and set(epoch.values()) == {1}  # version 1, every sample once
    assert not any("day2" in key for key in epoch)
    next_counts = {len(result["next"]) for result in after}
    assert next_counts == {after[0]["next_max"]} == {17}  # version 2: 34 samples, 17 per rank
    following = collections.Counter(key for result in after for key in result["next"])
    assert len(following) == 34 and sum("day2" in key for key in following) == 10
