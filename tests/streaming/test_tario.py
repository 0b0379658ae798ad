"""Tar reading: shards from webdataset, GNU tar, gzip, PAX; truncation and corruption."""

from __future__ import annotations

import contextlib
import io
import pathlib
import random
import shutil
import subprocess
import tarfile

import pytest

from shardstream._format.keys import split_key
from shardstream._format.tarformat import byte_sum
from shardstream._format.tarreader import iter_samples, open_tar, read_plain_sample
from shardstream._storage import Store
from shardstream._storage.backends.localmaps import LocalRanges
from shardstream.errors import ShardFormatError
from shardstream.streaming._worker.pieces import OffsetIndex, open_piece
from tests.streaming.shards import sample_offsets, tiny_jpeg


def _read(path: pathlib.Path) -> list[dict]:
    with open(path, "rb") as stream:
        return [sample for sample, _ in iter_samples(open_tar(stream, str(path)))]


def test_split_key_follows_webdataset_rule() -> None:
    assert split_key("a/b/x.seg.png") == ("a/b/x", "seg.png")
    assert split_key("x.jpg") == ("x", "jpg")
    for skipped in (".hidden.jpg", "a/.DS_Store", "__MACOSX/x.jpg", "README", "dir/", "x."):
        assert split_key(skipped) is None


def test_reads_webdataset_written_shard(tmp_path: pathlib.Path) -> None:
    import webdataset as wds

    path = tmp_path / "wds.tar"
    with wds.TarWriter(str(path)) as sink:
        for index in range(5):
            sink.write({"__key__": f"dir/k{index}", "jpg": tiny_jpeg(index), "cls": index})
    samples = _read(path)
    assert [s["__key__"] for s in samples] == [f"dir/k{i}" for i in range(5)]
    assert samples[2]["cls"] == b"2" and samples[2]["jpg"] == tiny_jpeg(2)


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs the tar command")
@pytest.mark.parametrize("flags,name", [("cf", "s.tar"), ("czf", "s.tar.gz")])
def test_reads_gnu_tar_with_dirs_dotfiles_and_missing_labels(
    tmp_path: pathlib.Path, flags: str, name: str
) -> None:
    tree = tmp_path / "tree"
    (tree / "cats" / "deep").mkdir(parents=True)
    (tree / "__MACOSX").mkdir()
    (tree / "cats" / "a.jpg").write_bytes(tiny_jpeg(1))
    (tree / "cats" / "a.cls").write_bytes(b"1")
    (tree / "cats" / "deep" / "b.jpg").write_bytes(tiny_jpeg(2))  # no label
    (tree / "cats" / ".DS_Store").write_bytes(b"junk")
    (tree / "__MACOSX" / "c.jpg").write_bytes(b"junk")
    long_dir = tree / ("x" * 120)
    long_dir.mkdir()
    (long_dir / "c.jpg").write_bytes(tiny_jpeg(3))
    members = [
        "cats/a.jpg",
        "cats/a.cls",
        "cats/deep",
        "cats/.DS_Store",
        "__MACOSX",
        f"{'x' * 120}/c.jpg",
    ]
    subprocess.run(["tar", flags, str(tmp_path / name), *members], cwd=tree, check=True)
    samples = _read(tmp_path / name)
    keys = [s["__key__"] for s in samples]
    assert keys == ["cats/a", "cats/deep/b", f"{'x' * 120}/c"]
    assert "cls" not in samples[1] and samples[2]["jpg"] == tiny_jpeg(3)


def test_reads_pax_long_names(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "pax.tar"
    name = "d" * 150 + "/sample.jpg"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size = len(tiny_jpeg(0))
        info.pax_headers = {"comment": "é"}
        tar.addfile(info, io.BytesIO(tiny_jpeg(0)))
    assert [s["__key__"] for s in _read(path)] == ["d" * 150 + "/sample"]


def _shard(tmp_path: pathlib.Path, count: int = 6) -> pathlib.Path:
    import webdataset as wds

    path = tmp_path / "shard.tar"
    with wds.TarWriter(str(path)) as sink:
        for index in range(count):
            sink.write({"__key__": f"k{index}", "jpg": tiny_jpeg(index), "cls": index})
    return path


def test_truncated_shard_names_shard_key_and_offset(tmp_path: pathlib.Path) -> None:
    path = _shard(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 + 100])
    with pytest.raises(ShardFormatError, match=r"shard\.tar.*(offset \d+).*key 'k\d'"):
        _read(path)


def test_corrupt_header_is_reported(tmp_path: pathlib.Path) -> None:
    path = _shard(tmp_path)
    data = bytearray(path.read_bytes())
    data[0:20] = b"garbage-garbage-garb"
    path.write_bytes(bytes(data))
    with pytest.raises(ShardFormatError, match="no valid tar header at byte offset 0"):
        _read(path)


def _pool(path: pathlib.Path) -> LocalRanges:
    return LocalRanges(Store(path.parent), max_idle=0)  # nothing left open after a piece


def test_pieces_seek_with_the_offset_index(tmp_path: pathlib.Path) -> None:
    path = _shard(tmp_path, 9)
    index = OffsetIndex()
    keys = [s["__key__"] for s in open_piece(_pool(path), path.name, 5, 8, index)]
    assert keys == ["k5", "k6", "k7"]
    assert [s["__key__"] for s in open_piece(_pool(path), path.name, 2, 4, index)] == ["k2", "k3"]
    tail = open_piece(_pool(path), path.name, 7, None, index)
    assert [s["__key__"] for s in tail] == ["k7", "k8"]
    with pytest.raises(ShardFormatError, match="manifest says"):
        list(open_piece(_pool(path), path.name, 0, 12, index))
    with pytest.raises(ShardFormatError, match="manifest says"):
        list(open_piece(_pool(path), path.name, 11, 12, OffsetIndex()))


def test_shards_of_the_same_name_in_two_stores_keep_their_own_offsets(
    tmp_path: pathlib.Path,
) -> None:
    """A mixture's datasets have shards of the same names; one worker's walked offsets of one
    must not be used to seek in the other (where samples have other sizes)."""
    import webdataset as wds

    paths = []
    for folder, size in (("a", 16), ("b", 64)):
        (tmp_path / folder).mkdir()
        paths.append(tmp_path / folder / "shard.tar")
        with wds.TarWriter(str(paths[-1])) as sink:
            for index in range(6):
                image = tiny_jpeg(index, size, size)
                sink.write({"__key__": f"{folder}{index}", "jpg": image, "cls": index})
    index = OffsetIndex()
    for path in paths:
        keys = [s["__key__"] for s in open_piece(_pool(path), path.name, 3, 5, index)]
        assert keys == [f"{path.parent.name}3", f"{path.parent.name}4"]


class _RecordingPool(LocalRanges):
    """A pool that records the byte ranges pieces ask for (lent or mapped)."""

    def __init__(self, path: pathlib.Path, calls: list[tuple[int, int | None]]) -> None:
        super().__init__(Store(path.parent), max_idle=0)
        self.calls = calls

    def lend(self, name: str, start: int = 0, end: int | None = None):  # type: ignore[no-untyped-def, override]
        self.calls.append((start, end))
        return super().lend(name, start, end)

    def view(self, name: str, begin: int, end: int, alone: bool = True) -> memoryview | None:
        self.calls.append((begin, end))
        return super().view(name, begin, end, alone)


def test_pieces_with_an_index_read_exactly_their_byte_range(tmp_path: pathlib.Path) -> None:
    path = _shard(tmp_path, 9)
    offsets = sample_offsets(path)
    calls: list[tuple[int, int | None]] = []
    pool = _RecordingPool(path, calls)
    keys = [s["__key__"] for s in open_piece(pool, path.name, 5, 8, None, offsets)]
    assert keys == ["k5", "k6", "k7"] and calls == [(offsets[5], offsets[8])]
    tail = [s["__key__"] for s in open_piece(pool, path.name, 7, None, None, offsets)]
    assert tail == ["k7", "k8"] and calls[-1] == (offsets[7], offsets[9])
    with pytest.raises(ShardFormatError, match="index lists 9 samples but the manifest says"):
        list(open_piece(pool, path.name, 0, 12, None, offsets))


def test_pieces_with_an_index_report_truncation_and_a_wrong_index(tmp_path: pathlib.Path) -> None:
    path = _shard(tmp_path, 9)
    offsets = sample_offsets(path)
    pool = _RecordingPool(path, [])
    wrong = [*offsets[:4], offsets[4] + 512, *offsets[5:]]
    with pytest.raises(ShardFormatError, match=r"shard\.tar: no valid tar header at byte offset"):
        list(open_piece(pool, path.name, 4, 6, None, wrong))
    path.write_bytes(path.read_bytes()[: offsets[6] + 700])
    pool = _RecordingPool(path, [])  # the next pass: its maps are made afresh (a shard cut in
    # place while a pass has it mapped faults, as with any memory-mapped reader; see tarfast)
    with pytest.raises(
        ShardFormatError, match=r"shard\.tar: truncated at byte offset \d+.*key 'k5'"
    ):
        list(open_piece(pool, path.name, 5, 8, None, offsets))


def _styled_shard(tmp_path: pathlib.Path, style: str) -> pathlib.Path:
    """Six samples with long names, written with GNU long-name, PAX or plain ustar headers;
    "dirs" adds a directory member inside a sample's byte range."""
    if style == "wds":
        return _shard(tmp_path)
    path = tmp_path / f"{style}.tar"
    formats = {"gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
    with tarfile.open(path, "w", format=formats.get(style, tarfile.USTAR_FORMAT)) as tar:
        for index in range(6):
            prefix = "d" * 120 + "/" if style in formats else "s/"
            for extension, data in (("jpg", tiny_jpeg(index)), ("cls", str(index).encode())):
                info = tarfile.TarInfo(f"{prefix}k{index}.{extension}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            if style == "dirs":
                folder = tarfile.TarInfo(f"s/dir{index}")
                folder.type = tarfile.DIRTYPE
                tar.addfile(folder)
    return path


@pytest.mark.parametrize("style", ["wds", "gnu", "pax", "ustar", "dirs"])
def test_reads_by_index_match_a_walk_whatever_the_headers(
    tmp_path: pathlib.Path, style: str
) -> None:
    path = _styled_shard(tmp_path, style)
    walked = _read(path)
    offsets = sample_offsets(path)
    indexed = list(open_piece(_pool(path), path.name, 0, 6, None, offsets))
    assert indexed == walked and len(walked) == 6
    # The fast path (memoryview data) takes every header style; only a sample whose range
    # holds another member type (a directory; not the last one's) goes through the full
    # reader (bytes).
    fast = [isinstance(sample["jpg"], memoryview) for sample in indexed]
    assert fast == ([False] * 5 + [True] if style == "dirs" else [True] * 6)


def test_fast_path_refuses_what_the_full_reader_must_judge(tmp_path: pathlib.Path) -> None:
    path = _shard(tmp_path, 3)
    offsets = sample_offsets(path)
    with open(path, "rb") as stream:  # two samples in one range: not the fast path's to judge
        assert read_plain_sample(stream, path.name, offsets[0], offsets[2], 1 << 20) is None
        stream.seek(offsets[0])  # a member over max_member_bytes
        assert read_plain_sample(stream, path.name, offsets[0], offsets[1], 10) is None
        stream.seek(offsets[1])
        sample = read_plain_sample(stream, path.name, offsets[1], offsets[2], 1 << 20)
    assert sample is not None and sample["__key__"] == "k1" and sample["jpg"] == tiny_jpeg(1)
    with pytest.raises(ShardFormatError, match="max_member_bytes=10"):
        list(open_piece(_pool(path), path.name, 0, 1, None, offsets, max_member_bytes=10))


def test_header_byte_sum_is_exact_for_any_block() -> None:
    rng = random.Random(7)
    blocks = [bytes(512), b"\xff" * 512, b"\x01" * 512, b"\x80" * 512, b"\x7f\xff" * 256]
    blocks += [rng.randbytes(512) for _ in range(2000)]
    edges = b"\x00\x01\x7f\x80\xfe\xff"  # around the halving and the odd-count correction
    blocks += [bytes(rng.choice(edges) for _ in range(512)) for _ in range(500)]
    for block in blocks:
        assert byte_sum(block) == sum(block)
    # A block inside a larger buffer (a shard's memory map) is summed in place, at its offset.
    joined = memoryview(b"\x07" * 3 + b"".join(blocks[:50]))
    for number, block in enumerate(blocks[:50]):
        assert byte_sum(joined, 3 + 512 * number) == sum(block)


def _headers_of_every_style() -> list[bytes]:
    """Header blocks as tarfile (ustar, GNU, PAX) and this library write them, short and long
    names, directories and links among them."""
    from shardstream._format.tarformat import member_header

    blocks = [
        member_header(name, size)
        for name, size in [
            ("a.jpg", 0),
            ("k/x.cls", 3),
            ("n" * 96 + ".jpg", 8**11 - 1),
            ("é.jpg", 5),
        ]
    ]
    for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        for name, kind in [
            ("x.jpg", tarfile.REGTYPE),
            ("d/", tarfile.DIRTYPE),
            ("l.jpg", tarfile.SYMTYPE),
            ("p" * 120 + "/y.jpg", tarfile.REGTYPE),
        ]:
            info = tarfile.TarInfo(name)
            info.type, info.size, info.mtime = kind, 12345 if kind == tarfile.REGTYPE else 0, 7
            with contextlib.suppress(ValueError):  # ustar refuses long names
                blocks.append(info.tobuf(format=fmt))
    return [block[start : start + 512] for block in blocks for start in range(0, len(block), 512)]


def test_the_usual_header_shortcut_agrees_with_the_careful_parse() -> None:
    """Whatever the shortcut accepts, the careful parse reads the same way; flipped bytes in a
    header make the shortcut refuse it (the careful path then reports it)."""
    from shardstream._format.tarformat import check_header, header_name, usual_header

    rng = random.Random(3)
    blocks = _headers_of_every_style()
    damaged = []
    for block in blocks:
        for _ in range(40):
            spot = rng.randrange(512)
            damaged.append(
                block[:spot] + bytes([block[spot] ^ (1 << rng.randrange(8))]) + block[spot + 1 :]
            )
    accepted = 0
    for block in blocks + damaged:
        quick = usual_header(block)
        if quick is None:
            continue
        accepted += 1
        size, kind = check_header(block, "x.tar", 0)  # raises if the shortcut let a bad one by
        assert quick == (size, kind, header_name(block))
    assert accepted >= len(blocks) // 3  # the usual headers do take the shortcut
    # Read in place from a shard's bytes (a memoryview, at the block's offset): the same answers,
    # and None for a block cut short at the end of the bytes.
    joined = memoryview(b"\0" * 5 + b"".join(blocks + damaged))
    for number, block in enumerate(blocks + damaged):
        assert usual_header(joined, 5 + 512 * number) == usual_header(block)
    assert usual_header(joined[:-1], 5 + 512 * (len(blocks + damaged) - 1)) is None
    # One flipped bit changes the byte sum or the stored checksum: the shortcut never takes it.
    assert all(usual_header(block) is None for block in damaged)
