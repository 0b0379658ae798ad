"""A real 2-rank (gloo) x 2-worker job restarted after samples were excluded under it: the
interrupted epoch ends on the version it began with, the next epoch reads each kept sample
once and no excluded one, equal on both ranks."""

from __future__ import annotations

import collections
import pathlib

import pytest

from shardstream._catalog.exclude import exclude_samples
from shardstream.shardwriter import build_shards
from tests.streaming.restarts import run_phase
from tests.streaming.shards import make_samples

GONE = [f"s{i:06d}" for i in range(0, 48, 6)]  # 8 of 48: 40 kept, 20 per rank


@pytest.mark.slow
def test_ranks_finish_the_epoch_then_read_only_kept_samples(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "ds"
    build_shards(make_samples(48), root, max_samples_per_shard=7)
    before = run_phase(tmp_path, root, "before", seed=5, batches=3)
    exclude_samples(root, GONE)
    after = run_phase(tmp_path, root, "after", seed=5, batches=3)
    epoch = collections.Counter(
        key for b, a in zip(before, after, strict=True) for key in b["consumed"] + a["rest"]
    )
    assert len(epoch) == 48 and set(epoch.values()) == {1}  # version 1, every sample once
    assert {len(result["rest"]) for result in after} == {after[0]["rest_max"]} == {18}
    following = collections.Counter(key for result in after for key in result["next"])
    assert {len(result["next"]) for result in after} == {after[0]["next_max"]} == {20}
    assert set(following.values()) == {1} and set(following) == {
        f"s{i:06d}" for i in range(48)
    } - set(GONE)
