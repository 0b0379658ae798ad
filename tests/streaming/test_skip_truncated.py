"""A truncated shard read with ``on_error="skip"``: counts exact and messages true, with workers.

The shard is cut at 500,000 of its ~1.1 MB. Every sample that ends past the cut is lost; the
workers must count exactly those (each lost sample once, whichever worker's batch it was in),
log each shard's error once per worker, and name the shard's real size rather than offsets
past its end.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from shardstream._format.manifest import read_manifest
from shardstream.shardwriter import build_shards
from tests.streaming.shards import sample_offsets

NUM_SAMPLES = 200
CUT_BYTES = 500_000

_READ = """
import sys
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
# Seed 2 puts no batch wholly on lost samples at 0 and 2 workers (such a batch raises).
ds = StreamingDataset(sys.argv[1], decode="raw", batch_size=8, on_error="skip", seed=2,
                      options=StreamOptions(output="dict"))
keys = [k for b in StreamingDataLoader(ds, num_workers=int(sys.argv[2])) for k in b["__key__"]]
print(len(keys), len(set(keys)))
"""


@pytest.fixture(scope="module")
def truncated(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, int]:
    """A one-shard dataset cut at ``CUT_BYTES``, and how many of its samples survive whole."""
    root = tmp_path_factory.mktemp("truncated") / "data"
    rng = np.random.default_rng(0)
    samples = [{"__key__": f"s{i:04d}", "bin": rng.bytes(4000 + 37 * (i % 50)), "cls": i % 10}
               for i in range(NUM_SAMPLES)]  # fmt: skip
    build_shards(samples, root, max_samples_per_shard=NUM_SAMPLES)
    shard = read_manifest(str(root)).shards[0]
    offsets = sample_offsets(root / shard.name)
    assert offsets[-1] > 2 * CUT_BYTES
    os.truncate(root / shard.name, CUT_BYTES)
    whole = int(np.count_nonzero(np.asarray(offsets[1:]) <= CUT_BYTES))
    return root, whole


@pytest.mark.parametrize("workers", [0, 2])
def test_a_truncated_shard_is_skipped_with_exact_counts_and_true_offsets(
    truncated: tuple[pathlib.Path, int], workers: int
) -> None:
    root, whole = truncated
    result = subprocess.run(
        [sys.executable, "-c", _READ, str(root), str(workers)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(whole), str(whole)]  # every whole sample, once
    log = result.stderr.splitlines()
    counted = [int(n) for line in log for n in re.findall(r"worker skipped (\d+) sample", line)]
    assert sum(counted) == NUM_SAMPLES - whole, result.stderr  # each lost sample once
    assert len(counted) == max(1, workers)
    assert all("unreadable shards: shard-000000.tar" in line for line in log
               if "worker skipped" in line)  # fmt: skip
    errors = [line for line in log if line.startswith("skipping samples")]
    assert 1 <= len(errors) <= max(1, workers), result.stderr  # once per shard and worker
    for line in errors:
        assert "shard-000000.tar" in line and "on_error='skip'" not in line.split(": ", 1)[1]
        assert "after key ''" not in line
        # Offsets named are inside the file, or the message says what the file holds.
        offsets = [int(n.replace(",", "")) for n in re.findall(r"byte offset ([\d,]+)", line)]
        assert all(offset <= CUT_BYTES for offset in offsets), line
        if not offsets:
            assert f"the shard is {CUT_BYTES:,} bytes, but its index puts sample" in line
