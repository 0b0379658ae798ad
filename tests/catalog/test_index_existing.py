"""Shards made by other tools (webdataset's ShardWriter, GNU tar), indexed in place or into DEST,
then read with every guarantee: len, exact equal epochs on real gloo ranks, elastic restore."""

from __future__ import annotations

import collections
import io
import json
import logging
import os
import pathlib
import subprocess
import tarfile

import pytest
import torch.distributed as dist
import webdataset as wds

from shardstream import ConfigError, RandomAccessDataset, SourceError, index_shards, read_manifest
from shardstream._cli import main as cli_main
from shardstream._format.verify import verify_dataset
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from tests.ddp import exit_rank_cleanly, spawn_ranks
from tests.streaming.shards import tiny_jpeg

NUM = 37


def _webdataset_shards(
    folder: pathlib.Path, suffix: str = ".tar", per_shard: int = 8
) -> pathlib.Path:
    """``webdataset.ShardWriter`` output: jpg + cls + txt + json per sample (gz for .tar.gz)."""
    folder.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(folder / f"part-%05d{suffix}"), maxcount=per_shard) as sink:
        for i in range(NUM):
            sink.write({"__key__": f"img{i:05d}", "jpg": tiny_jpeg(i % 16), "cls": i % 3,
                        "txt": f"caption {i}", "json": {"i": i}})  # fmt: skip
    return folder


def _tar_shards(folder: pathlib.Path, *flags: str) -> pathlib.Path:
    """GNU ``tar`` of per-shard folders: directory entries, then files; padded to 10 KiB."""
    for shard in range(3):
        source = folder / f"src{shard}"
        (source / "d").mkdir(parents=True)
        for i in range(shard * 5, shard * 5 + 5):
            (source / "d" / f"k{i:03d}.jpg").write_bytes(tiny_jpeg(i % 16))
            (source / "d" / f"k{i:03d}.cls").write_text(str(i % 2))
        subprocess.run(
            ["tar", *flags, "-cf", str(folder / f"t{shard}.tar"), "-C", str(source), "d"],
            check=True,
        )
    return folder


def _keys(root: pathlib.Path, **options: object) -> list[str]:
    ds = StreamingDataset(root, batch_size=4, options=StreamOptions(output="dict", **options))
    return [key for batch in StreamingDataLoader(ds, num_workers=2) for key in batch["__key__"]]


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
def test_webdataset_shards_indexed_in_place_read_exactly(
    tmp_path: pathlib.Path, suffix: str
) -> None:
    shards = _webdataset_shards(tmp_path / "wds", suffix)
    before = {p.name: p.read_bytes() for p in shards.iterdir()}
    manifest = index_shards(shards, workers=2)
    assert {p.name: p.read_bytes() for p in shards.iterdir() if p.name in before} == before
    assert manifest.num_samples == NUM and len(manifest.shards) == 5
    assert all((shard.index is None) == suffix.endswith(".gz") for shard in manifest.shards)
    keys = _keys(shards)
    assert sorted(set(keys)) == [f"img{i:05d}" for i in range(NUM)] and len(keys) == NUM
    assert verify_dataset(shards).num_samples == NUM
    info = json.loads((shards / "_info.json").read_text())  # timm reads it
    assert sum(split["num_samples"] for split in info["splits"].values()) == NUM


def test_gnu_tar_shards_index_when_sorted_and_are_refused_with_the_fix_when_not(
    tmp_path: pathlib.Path,
) -> None:
    # Unsorted, GNU tar follows the directory's order: a key's files need not be adjacent.
    (tmp_path / "unsorted").mkdir()
    _write_tar(tmp_path / "unsorted" / "x.tar", ["d/b.jpg", "d/a.jpg", "d/b.cls", "d/a.cls"])
    with pytest.raises(SourceError, match=r"'d/b' comes back(.|\n)*tar --sort=name"):
        index_shards(tmp_path / "unsorted")
    shards = _tar_shards(tmp_path / "tar", "--sort=name")
    manifest = index_shards(shards)
    assert manifest.num_samples == 15
    assert all(shard.num_bytes % 10240 == 0 for shard in manifest.shards)  # GNU tar padding
    assert sorted(_keys(shards)) == [f"d/k{i:03d}" for i in range(15)]


@pytest.mark.parametrize("what", ["folder", "dot"])
def test_gnu_tar_shards_starting_with_a_directory_entry_verify_and_read_by_index(
    tmp_path: pathlib.Path, what: str, caplog: pytest.LogCaptureFixture
) -> None:
    # `tar -cf c0.tar c0` and `tar --sort=name -cf c0.tar .` both begin with a directory
    # entry: the first sample starts at byte 512, and the index says so.
    shards = tmp_path / "shards"
    source = _tar_shards(tmp_path / "src", "--sort=name")
    shards.mkdir()
    for shard in range(3):
        folder = source / f"src{shard}" / "d"
        names = ["d"] if what == "folder" else ["."]
        workdir = folder.parent if what == "folder" else folder
        subprocess.run(["tar", "--sort=name", "-cf", str(shards / f"c{shard}.tar"), "-C",
                        str(workdir), *names], check=True)  # fmt: skip
    manifest = index_shards(shards)
    assert verify_dataset(shards).num_samples == manifest.num_samples == 15
    assert cli_main(["verify", str(shards)]) == 0
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        keys = [sample["__key__"] for sample in StreamingDataset(
            shards, decode="raw", options=StreamOptions(output="dict"))]  # fmt: skip
        ranked = RandomAccessDataset(shards, decode="raw")
        assert ranked[7][1] == 7 % 2
    assert len(keys) == 15 and not caplog.records, [r.getMessage() for r in caplog.records]


def test_index_into_dest_leaves_a_read_only_source_alone(tmp_path: pathlib.Path) -> None:
    shards = _webdataset_shards(tmp_path / "ro")
    os.chmod(shards, 0o555)
    try:
        if not os.access(shards, os.W_OK):  # root writes read-only folders: nothing to refuse
            with pytest.raises(ConfigError, match="give DEST"):
                index_shards(shards)
        dest = tmp_path / "meta"
        manifest = index_shards(str(shards / "part-{00000..00004}.tar"), dest)
    finally:
        os.chmod(shards, 0o755)
    assert manifest.shard_root == str(shards) and not list(shards.glob("*.idx"))
    keys = _keys(dest)
    assert read_manifest(dest) == manifest and sorted(keys) == [f"img{i:05d}" for i in range(NUM)]
    assert verify_dataset(dest).num_samples == NUM


def _write_tar(path: pathlib.Path, names: list[str]) -> None:
    with tarfile.open(path, "w") as archive:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 1
            archive.addfile(info, io.BytesIO(b"x"))


def test_what_breaks_exactness_is_refused_clearly(tmp_path: pathlib.Path) -> None:
    split = tmp_path / "split"
    split.mkdir()
    _write_tar(split / "a.tar", ["k1.jpg", "k2.jpg", "k2.cls"])
    _write_tar(split / "b.tar", ["k2.txt", "k3.jpg"])  # k2 continues in the next shard
    with pytest.raises(SourceError, match=r"'k2' is split across a\.tar and b\.tar"):
        index_shards(split)
    back = tmp_path / "back"
    back.mkdir()
    _write_tar(back / "a.tar", ["k1.jpg", "k2.jpg", "k1.cls"])  # k1 comes back after k2
    with pytest.raises(SourceError, match="'k1' comes back"):
        index_shards(back)
    stray = tmp_path / "stray"
    stray.mkdir()
    _write_tar(stray / "a.tar", ["k1.jpg", "__MACOSX/._k1.jpg", "README"])
    with pytest.raises(SourceError, match="2 file member"):
        index_shards(stray)
    assert index_shards(stray, allow_extra_members=True).num_samples == 1


def test_a_killed_index_goes_on_where_it_stopped(tmp_path: pathlib.Path) -> None:
    shards = _webdataset_shards(tmp_path / "wds", per_shard=2)  # 19 shards
    opened: list[str] = []
    limit = [8]
    from shardstream._catalog import indexer

    real = indexer._index_task

    def counting(task):  # type: ignore[no-untyped-def]
        opened.extend(task.names)
        if len(opened) > limit[0]:
            raise KeyboardInterrupt  # the run dies after two batches of 4
        return real(task)

    indexer._index_task = counting
    try:
        with pytest.raises(KeyboardInterrupt):
            index_shards(shards, shards_per_task=4)
    finally:
        indexer._index_task = real
    assert not (shards / "manifest.json").exists()
    opened.clear()
    limit[0] = NUM
    indexer._index_task = counting
    try:
        manifest = index_shards(shards, shards_per_task=4)
    finally:
        indexer._index_task = real
    assert len(opened) == 19 - 8 and manifest.num_samples == NUM
    assert not (shards / "_shardstream_index").exists()


def _ranks(rank: int, root: str, store: str, out: str, steps: int) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        ds = StreamingDataset(root, batch_size=2, options=StreamOptions(output="dict"))
        loader = StreamingDataLoader(ds, num_workers=2)
        iterator = iter(loader)
        head = [k for _ in range(steps) for k in next(iterator)["__key__"]]
        state = loader.state_dict()
        del iterator
        rest = [k for batch in loader for k in batch["__key__"]] if steps == 0 else []
        pathlib.Path(out, f"{rank}.json").write_text(
            json.dumps({"head": head, "rest": rest, "state": state, "len": len(ds)})
        )
        dist.barrier()
    finally:
        dist.destroy_process_group()
    exit_rank_cleanly()


@pytest.mark.slow
def test_indexed_shards_give_exact_epochs_on_gloo_ranks_and_restore_elastically(
    tmp_path: pathlib.Path,
) -> None:
    shards = _webdataset_shards(tmp_path / "wds")
    index_shards(shards)
    for steps in (0, 3):
        out = tmp_path / f"out{steps}"
        out.mkdir()
        spawn_ranks(
            _ranks,
            args=(str(shards), str(tmp_path / f"store{steps}"), str(out), steps),
            nprocs=2,
            join=True,
        )
        results = [json.loads((out / f"{r}.json").read_text()) for r in range(2)]
        if steps == 0:  # a whole epoch: equal ranks, every sample, < 2 repeats
            assert len(results[0]["rest"]) == len(results[1]["rest"]) == 2 * results[0]["len"] - 1
            seen = collections.Counter(k for r in results for k in r["rest"])
            assert len(seen) == NUM and sum(seen.values()) == NUM + 1
    head = [k for r in results for k in r["head"]]
    state = results[0]["state"]  # rank 0's, as Lightning saves it
    ds = StreamingDataset(shards, batch_size=3, options=StreamOptions(output="dict"))
    restored = StreamingDataLoader(ds, num_workers=2)
    restored.load_state_dict(state, allow_new_batch_size=True)  # 2 ranks -> 1, batch 2 -> 3
    rest = [k for batch in restored for k in batch["__key__"]]
    assert set(head) | set(rest) == {f"img{i:05d}" for i in range(NUM)}
    assert len(head) + len(rest) - NUM < 3  # pad repeats fewer than W + W'
