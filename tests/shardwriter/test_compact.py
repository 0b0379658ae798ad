"""Compact and prune: the shards that hold excluded samples are rewritten without them, every
other shard stays, and once the old versions are pruned the excluded bytes are in no file.
Kills: exclude and compact SIGKILLed at every phase leave the old or the new version, and a
rerun ends byte-identical to an uninterrupted run (``abandon`` instead returns to the old)."""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import signal
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from shardstream import StreamingDataset, StreamOptions, build_shards, read_manifest
from shardstream._catalog.exclude import exclude_samples
from shardstream._catalog.versions import prune_versions
from shardstream._format import tarformat as tarwriter
from shardstream._format.verify import find_problems, verify_dataset
from shardstream._storage import Store
from shardstream._storage.backends.local import LocalBackend
from shardstream.shardwriter._append import abandon_append
from shardstream.shardwriter._compact import compact_dataset
from tests.streaming.shards import keys_of, tiny_jpeg

from .helpers import kill_at, read_with_webdataset

NUM = 60
GONE = ["k0003", "k0004", "k0040", "k0059"]  # in shards 0, 0, 3 and 4 (12 samples each)


def _samples() -> list[dict[str, Any]]:
    return [{"__key__": f"k{i:04d}", "jpg": tiny_jpeg(i % 16), "cls": i % 3,
             "txt": f"secret payload {i:04d}"} for i in range(NUM)]  # fmt: skip


def _tree(root: pathlib.Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path, but the lock file and the temporaries of
    killed atomic writes of the dataset's manifest (removed by ``abandon``)."""
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
        and path.name != ".shardstream.lock"
        and not (path.parent == root and ".tmp-" in path.name)
    }


def _made(root: pathlib.Path) -> pathlib.Path:
    build_shards(_samples(), root, max_samples_per_shard=12)
    return root


def test_compact_rewrites_only_shards_with_exclusions_and_prune_removes_the_bytes(
    tmp_path: pathlib.Path,
) -> None:
    root = _made(tmp_path / "ds")
    exclude_samples(root, GONE)
    before = _tree(root)
    manifest = compact_dataset(root)
    assert manifest.version == 3 and manifest.exclusions is None
    names = list(manifest.shards.names)
    assert names == [
        "compacted/v000003/shard-000000.tar",
        "shard-000001.tar",
        "shard-000002.tar",
        "compacted/v000003/shard-000003.tar",
        "compacted/v000003/shard-000004.tar",
    ]
    swapped = ("manifest.json", "_info.json")  # replaced, in one step each
    after = _tree(root)
    assert {name: after[name] for name in before if name not in swapped} == {
        name: data for name, data in before.items() if name not in swapped
    }
    kept = sorted(f"k{i:04d}" for i in range(NUM) if f"k{i:04d}" not in GONE)
    options = StreamOptions(output="dict")
    assert sorted(keys_of(StreamingDataset(root, decode="raw", options=options))) == kept
    assert sorted(sample["__key__"] for sample in read_with_webdataset(root)) == kept
    assert verify_dataset(root).num_samples == NUM - len(GONE)
    secret = b"secret payload 0040"
    assert any(secret in data for data in _tree(root).values())  # versions 1, 2 still read it
    assert prune_versions(Store(str(root)), keep=1) == [1, 2]
    assert not any(secret in data for data in _tree(root).values())
    assert not (root / "shard-000000.tar").exists() and (root / "shard-000001.tar").exists()
    assert sorted(keys_of(StreamingDataset(root, decode="raw", options=options))) == kept
    assert compact_dataset(root).version == 3  # nothing excluded: nothing to do
    exclude_samples(root, ["k0005"])  # in a shard compacted already: compacted again
    again = compact_dataset(root)
    assert again.shards[0].name == "compacted/v000005/shard-000000.tar"
    assert prune_versions(Store(str(root)), keep=1) == [3, 4]
    assert not (root / "compacted" / "v000003" / "shard-000000.tar").exists()
    assert verify_dataset(root).num_samples == NUM - len(GONE) - 1


def _in_child(target: Callable[..., None], *args: Any) -> multiprocessing.Process:
    child = multiprocessing.get_context("fork").Process(target=target, args=args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # forking a threaded process
        child.start()
    return child


def _named(*fragments: str) -> Callable[[tuple], bool]:
    """For ``os.replace(source, target)``: the target names every fragment."""
    return lambda args: all(fragment in str(args[1]) for fragment in fragments)


def _created(name: str) -> Callable[[tuple], bool]:
    """For ``LocalBackend.create_exclusive(backend, fs, path, ...)``: the path names ``name``."""
    return lambda args: name in str(args[2])


#: name -> (object owning the patched function, its attribute, ``when(call_args)``).
KILL_POINTS: dict[str, tuple[Any, str, Callable[[tuple], bool]]] = {
    "excluded-sidecar": (LocalBackend, "create_exclusive", _created("manifest.v000002.excluded")),
    "keep-version-1": (LocalBackend, "create_exclusive", _created("manifest.v000001.json")),
    "versioned-manifest": (LocalBackend, "create_exclusive", _created("manifest.v000002.json")),
    "compact-mid-shard": (tarwriter.TarShardWriter, "write_member", lambda args: True),
    "compact-shard-renamed": (os, "replace", _named("compacted", ".idx")),
    "compact-timm-info": (os, "replace", _named("_info.json")),
    "compact-versioned": (LocalBackend, "create_exclusive", _created("manifest.v000003.json")),
    "manifest-not-renamed": (os, "replace", lambda args: str(args[1]).endswith("manifest.json")),
}


def _run_and_kill_at(point: str, nth: int, root: pathlib.Path) -> None:
    """Forked child: exclude (and compact), with a SIGKILL at the nth matching call."""
    kill_at(*KILL_POINTS[point], nth)
    if read_manifest(root).version == 1:
        exclude_samples(root, GONE)
    compact_dataset(root)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    """The folder after the build, after the exclude and after the compact, uninterrupted."""
    root = _made(tmp_path_factory.mktemp("clean") / "ds")
    stages = {"built": _tree(root)}
    exclude_samples(root, GONE)
    stages["excluded"] = _tree(root)
    compact_dataset(root)
    stages["compacted"] = _tree(root)
    return stages


@pytest.mark.parametrize(
    ("point", "nth"),
    [
        ("excluded-sidecar", 1),
        ("keep-version-1", 1),
        ("versioned-manifest", 1),
        ("manifest-not-renamed", 1),  # the exclude's
        ("compact-mid-shard", 30),
        ("compact-shard-renamed", 2),
        ("compact-timm-info", 1),
        ("compact-versioned", 1),
        ("manifest-not-renamed", 2),  # the compact's
    ],
)
def test_exclude_and_compact_killed_at_any_point_then_rerun(
    clean: dict[str, dict[str, bytes]], tmp_path: pathlib.Path, point: str, nth: int
) -> None:
    root = _made(tmp_path / "ds")
    child = _in_child(_run_and_kill_at, point, nth, root)
    child.join(timeout=120)
    assert child.exitcode == -signal.SIGKILL, f"never reached {point} #{nth}"
    published = (root / "manifest.json").read_bytes()
    stages = [stage["manifest.json"] for stage in clean.values()]
    assert published in stages  # one whole version: the build's, the exclude's or the compact's
    assert find_problems(Store(str(root)), read_manifest(root)) == []
    exclude_samples(root, GONE)  # the same commands again: each a no-op once published
    compact_dataset(root)
    assert _tree(root) == clean["compacted"]


def test_abandon_removes_what_a_killed_compact_wrote(
    clean: dict[str, dict[str, bytes]], tmp_path: pathlib.Path
) -> None:
    root = _made(tmp_path / "ds")
    exclude_samples(root, GONE)
    child = _in_child(_run_and_kill_at, "compact-versioned", 1, root)
    child.join(timeout=120)
    assert child.exitcode == -signal.SIGKILL
    removed = abandon_append(root)
    assert "compacted/v000003/" in removed
    assert _tree(root) == clean["excluded"]
    compact_dataset(root)
    assert _tree(root) == clean["compacted"]


def test_foreign_shards_indexed_in_place_exclude_and_compact(tmp_path: pathlib.Path) -> None:
    import webdataset as wds

    from shardstream import index_shards

    folder = tmp_path / "wds"
    folder.mkdir()
    with wds.ShardWriter(str(folder / "part-%05d.tar"), maxcount=12) as sink:
        for sample in _samples():
            sink.write(sample)
    index_shards(folder)
    exclude_samples(folder, GONE)
    options = StreamOptions(output="dict")
    kept = sorted(f"k{i:04d}" for i in range(NUM) if f"k{i:04d}" not in GONE)
    assert sorted(keys_of(StreamingDataset(folder, decode="raw", options=options))) == kept
    compact_dataset(folder)
    prune_versions(Store(str(folder)), keep=1)
    assert not (folder / "part-00000.tar").exists() and (folder / "part-00001.tar").exists()
    assert sorted(keys_of(StreamingDataset(folder, decode="raw", options=options))) == kept
    assert sorted(sample["__key__"] for sample in read_with_webdataset(folder)) == kept
    assert verify_dataset(folder).num_samples == len(kept)
    index_shards(folder)  # the folder's listing still starts with the indexed shards: no-op
    assert read_manifest(folder).version == 3
    with wds.TarWriter(str(folder / "part-00009.tar")) as sink:  # the folder gains a shard
        sink.write({"__key__": "late", "jpg": tiny_jpeg(1), "cls": 0, "txt": "late"})
    grown = index_shards(folder)
    assert grown.version == 4 and grown.shards[-1].name == "part-00009.tar"
    every = sorted(keys_of(StreamingDataset(folder, decode="raw", options=options)))
    assert every == sorted([*kept, "late"])
