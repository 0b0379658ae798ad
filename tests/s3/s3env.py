"""Constants and small helpers shared by the S3 tests (the fixtures live in conftest.py)."""

from __future__ import annotations

from typing import Any

BUCKET = "shardstream-test"
ACCESS_KEY = "AKIATESTSHARDSTREAM0"
#: A distinctive dummy secret, so tests can check that it never appears anywhere.
SECRET_KEY = "s3cr3t-DO-NOT-LEAK-9f8e7d6c5b4a"


def make_fs(endpoint_url: str) -> Any:
    """A fresh s3fs filesystem on ``endpoint_url`` (not shared with the code under test)."""
    import s3fs

    return s3fs.S3FileSystem(endpoint_url=endpoint_url, skip_instance_cache=True)


def payload(num_bytes: int, seed: int = 0) -> bytes:
    """Deterministic, non-repeating bytes (so a duplicated or lost range changes the result)."""
    import numpy as np

    return np.random.default_rng(seed).integers(0, 256, size=num_bytes, dtype=np.uint8).tobytes()
