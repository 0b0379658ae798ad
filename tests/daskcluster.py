"""A real Dask cluster of 2 local worker processes, for the tests that run work on it."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import pytest


@contextlib.contextmanager
def dask_client() -> Iterator[Any]:
    """A ``distributed.Client`` of a 2-process ``LocalCluster`` (the test is skipped without
    the ``distributed`` package), closed with the cluster on exit."""
    distributed = pytest.importorskip("distributed")
    with warnings.catch_warnings():
        # Dask's own start-up/shutdown noise only; our code must stay warning-free elsewhere.
        warnings.filterwarnings(
            "ignore", category=DeprecationWarning, module=r"(distributed|dask|tornado)"
        )
        warnings.filterwarnings("ignore", category=ResourceWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module=r"distributed")
        with (
            distributed.LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
            ) as cluster,
            distributed.Client(cluster) as client,
        ):
            yield client
