"""Helpers shared by the shard writer tests: read shards back with the webdataset library, and
kill a build at a chosen call."""

from __future__ import annotations

import gc
import itertools
import os
import pathlib
import signal
import tarfile
import warnings
from collections.abc import Callable
from typing import Any

import webdataset as wds

from shardstream._format.manifest import Manifest, read_manifest


def shard_paths(dest: pathlib.Path) -> list[str]:
    manifest = read_manifest(str(dest))
    return [str(dest / shard.name) for shard in manifest.shards]


def read_with_webdataset(dest: pathlib.Path) -> list[dict]:
    """Every sample of a dataset as webdataset yields it (raw bytes, no decoding)."""
    # webdataset 1.0 leaves shard files to the garbage collector; collect them here, with its
    # ResourceWarning silenced, so that the warning does not fail an unrelated later test.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        dataset = wds.WebDataset(shard_paths(dest), shardshuffle=False, empty_check=False)
        samples = [
            {k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"}
            for s in dataset
        ]
        del dataset
        gc.collect()
    return samples


def tar_members(path: pathlib.Path | str) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as archive:
        return [(m.name, archive.extractfile(m).read()) for m in archive]  # type: ignore[union-attr]


def dataset_bytes(dest: pathlib.Path) -> dict[str, bytes]:
    """Every file of a finished dataset folder, by name."""
    return {p.name: p.read_bytes() for p in sorted(dest.iterdir()) if p.is_file()}


def manifest_of(dest: pathlib.Path) -> Manifest:
    return read_manifest(str(dest))


def kill_at(owner: Any, name: str, when: Callable[[tuple[Any, ...]], bool], nth: int) -> None:
    """Make ``owner.name`` SIGKILL this process at its ``nth`` call whose args ``when`` accepts.

    For forked children of the kill tests: the child runs a build after this and never returns
    normally when the point is reached.
    """
    original = getattr(owner, name)
    matching = itertools.count(1)

    def killing(*args: Any, **kwargs: Any) -> Any:
        if when(args) and next(matching) == nth:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)

    setattr(owner, name, killing)
