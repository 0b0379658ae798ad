"""Fuzzing the reader: any bytes as a shard, index or manifest end in samples or a clear error.

The mutator lives in :mod:`tests.streaming.fuzzing`; it runs in a child process so that its
address-space cap and per-case alarm cannot disturb the test process, and a hang fails the test
(the child's own per-case bound, then this test's timeout) instead of stalling CI.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_thousands_of_mutated_shards_end_in_samples_or_shard_format_error() -> None:
    seed = int(os.environ.get("SHARDSTREAM_FUZZ_SEED", "0"))
    command = [
        sys.executable,
        "-m",
        "tests.streaming.fuzzing",
        "--cases",
        "3000",
        "--seed",
        str(seed),
        "--case-timeout-s",
        "2",
        "--extra-memory-mb",
        "512",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["failures"] == [], "\n".join(report["failures"][:20])
    # The mutations reach both outcomes, so the reader's deep paths are exercised.
    assert report["counts"]["samples"] > 100 and report["counts"]["error"] > 1000
    assert report["slowest"][0] < 2.0
    assert report["rss_growth_mb"] < 128, "reading broken shards must not grow memory"
