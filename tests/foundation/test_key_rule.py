"""One key rule: the writer, the reader and verify group member names into samples alike."""

from __future__ import annotations

import io
import pathlib
import tarfile

import pytest

from shardstream import SourceError, build_shards
from shardstream._format.keys import split_key
from shardstream._format.tarreader import iter_samples, open_tar
from shardstream._format.verify import check_shard, scan_shard
from shardstream._storage import Store

NAMES = ["a.b.c", "x.", "__MACOSX/._k.jpg", "k.jpg", "k.cls", ".hidden.jpg", "d/e.f.png", "noext"]


def _tar(path: pathlib.Path, names: list[str]) -> pathlib.Path:
    """A shard written by another tool: every name as a member, plus a directory entry."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as archive:
        directory = tarfile.TarInfo("d")
        directory.type = tarfile.DIRTYPE
        archive.addfile(directory)
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 3
            archive.addfile(info, io.BytesIO(b"abc"))
    return path


def test_the_reader_and_verify_group_names_by_the_same_rule(tmp_path: pathlib.Path) -> None:
    shard = _tar(tmp_path / "other.tar", NAMES)
    with open(shard, "rb") as stream:
        reader = open_tar(stream, str(shard))
        samples = [
            (s["__key__"], sorted(k for k in s if not k.startswith("__")))
            for s, _ in iter_samples(reader)
        ]
    expected = [split_key(name) for name in NAMES]
    assert samples == [("a", ["b.c"]), ("k", ["cls", "jpg"]), ("d/e", ["f.png"])]
    assert [pair[0] for pair in expected if pair] == ["a", "k", "k", "d/e"]
    assert reader.skipped_members == 1  # the directory
    assert reader.stray_files == sum(pair is None for pair in expected)
    with open(shard, "rb") as stream:
        scan = scan_shard(stream, str(shard))
    assert scan.num_samples == len(samples) and scan.first_key == "a" and scan.last_key == "d/e"
    assert (scan.skipped_members, scan.stray_files) == (1, reader.stray_files)
    from shardstream._format.manifest import ShardInfo

    info = ShardInfo("other.tar", scan.num_samples, scan.num_bytes, scan.sha256)
    problems = check_shard(Store(str(tmp_path)), info)
    assert len(problems) == 1 and "unexpected member" in problems[0], problems


@pytest.mark.parametrize(
    "sample,message",
    [
        ({"__key__": "x.", "jpg": b"1"}, "contains a '.'"),
        ({"__key__": "a.b", "jpg": b"1"}, "contains a '.'"),
        ({"__key__": "__MACOSX/k", "jpg": b"1"}, "skip"),
        ({"__key__": "k", "": b"1"}, "cannot be a member extension"),
        ({"__key__": "k", "a/b": b"1"}, "cannot be a member extension"),
    ],
)
def test_the_writer_refuses_what_readers_would_read_back_otherwise(
    tmp_path: pathlib.Path, sample: dict, message: str
) -> None:
    with pytest.raises(SourceError, match=message):
        build_shards([sample], tmp_path / "out")


def test_a_dotted_extension_reads_back_under_its_key(tmp_path: pathlib.Path) -> None:
    manifest = build_shards([{"__key__": "a", "b.c": b"xyz", "jpg": b"1"}], tmp_path / "out")
    shard = tmp_path / "out" / manifest.shards[0].name
    with open(shard, "rb") as stream:
        ((sample, _),) = list(iter_samples(open_tar(stream, str(shard))))
    assert sample["__key__"] == "a" and sample["b.c"] == b"xyz"
    assert check_shard(Store(str(tmp_path / "out")), manifest.shards[0]) == []
