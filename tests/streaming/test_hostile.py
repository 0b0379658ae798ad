"""Broken and hostile shards, indexes and manifests: bounded time and memory, clear errors, skips.

Each case is one of the failures found by probing the reader: declared sizes far beyond the
shard, PAX records that made the parser spin, malformed numbers and gzip streams that escaped as
other exceptions.
"""

from __future__ import annotations

import gzip
import json
import pathlib
import tracemalloc

import pytest

from shardstream._format.manifest import Manifest
from shardstream._format.tarreader import iter_samples, open_tar
from shardstream.errors import ManifestError, ShardFormatError
from shardstream.streaming import StreamingDataset, StreamOptions
from tests.streaming.fuzzing import pax_shard, tar_header
from tests.streaming.shards import keys_of, make_dataset, tiny_jpeg

DICT = StreamOptions(output="dict", shuffle_buffer=4, num_open=2, piece_size=4)


def _member(name: bytes, payload: bytes, declared: int | None = None, kind: bytes = b"0") -> bytes:
    size = len(payload) if declared is None else declared
    return tar_header(name, size, kind) + payload + bytes(-len(payload) % 512)


def _read_file(path: pathlib.Path) -> list[dict]:
    with open(path, "rb") as stream:
        return [sample for sample, _ in iter_samples(open_tar(stream, str(path)))]


def _write(tmp_path: pathlib.Path, data: bytes, name: str = "bad.tar") -> pathlib.Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "kind,declared",
    [(b"0", 8 << 30), (b"L", 2 << 30), (b"x", 3 << 30)],
    ids=["member", "gnu-long-name", "pax-header"],
)
def test_sizes_beyond_the_shard_are_refused_without_allocating(
    tmp_path: pathlib.Path, kind: bytes, declared: int
) -> None:
    good = _member(b"k0.jpg", tiny_jpeg(0))
    path = _write(tmp_path, good + _member(b"k1.jpg", b"x" * 600, declared, kind) + bytes(1024))
    tracemalloc.start()
    try:
        where = rf"bad\.tar: .*byte offset {len(good)} declares"
        with pytest.raises(ShardFormatError, match=where):
            _read_file(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20


def test_gnu_base256_size_is_parsed_and_bounded(tmp_path: pathlib.Path) -> None:
    header = bytearray(tar_header(b"k0.jpg", 0, b"0"))
    header[124:136] = b"\x80" + (1 << 40).to_bytes(11, "big")
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    path = _write(tmp_path, bytes(header) + bytes(2048))
    with pytest.raises(ShardFormatError, match=f"declares {1 << 40} bytes, but the shard ends"):
        _read_file(path)


def test_max_member_bytes_bounds_shards_of_unknown_size(tmp_path: pathlib.Path) -> None:
    # Gzipped: the uncompressed size is unknown, so only max_member_bytes bounds a member.
    data = _member(b"k0.jpg", tiny_jpeg(0)) + _member(b"k1.bin", b"y" * 5000) + bytes(1024)
    path = _write(tmp_path, gzip.compress(data), "big.tar.gz")
    with open(path, "rb") as stream:
        reader = open_tar(stream, str(path), max_member_bytes=4096)
        with pytest.raises(ShardFormatError, match=r"'k1\.bin' .* more than max_member_bytes=4096"):
            list(iter_samples(reader))


@pytest.mark.parametrize(
    "records",
    [
        b"0 path=x\n",
        b"-5 path=x\n",
        b"abc path=x\n",
        b"99 path=x\n",
        b"15 path=a.jpg",
        b"13 size=abcd\n",
        b"9 novalue\n",
    ],
)
def test_malformed_pax_records_raise_instead_of_spinning(
    tmp_path: pathlib.Path, records: bytes
) -> None:
    path = _write(tmp_path, pax_shard(records))
    with pytest.raises(ShardFormatError, match="malformed PAX extended header at byte offset 0"):
        _read_file(path)


def test_well_formed_pax_path_is_used(tmp_path: pathlib.Path) -> None:
    record = b"path=dir/long.jpg\n"
    record = b"%d %s" % (len(record) + 3, record)
    path = _write(tmp_path, pax_shard(record))
    samples = _read_file(path)
    assert [s["__key__"] for s in samples] == ["dir/long"]
    assert samples[0]["jpg"].startswith(b"\xff\xd8")


@pytest.mark.parametrize("field", [b"zzzzzzzzzzz\0", b"-0000000001\0", b"\xff" * 12])
def test_malformed_size_numbers_are_shard_format_errors(
    tmp_path: pathlib.Path, field: bytes
) -> None:
    header = bytearray(tar_header(b"k0.jpg", 0, b"0"))
    header[124:136] = field
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    path = _write(tmp_path, bytes(header) + bytes(1024))
    with pytest.raises(ShardFormatError, match="at byte offset 0"):
        _read_file(path)


def _gzip_shard(tmp_path: pathlib.Path) -> bytes:
    members = b"".join(_member(b"k%d.jpg" % i, tiny_jpeg(i)) for i in range(6))
    return gzip.compress(members + bytes(1024), mtime=0)


def test_broken_and_truncated_gzip_are_shard_format_errors(tmp_path: pathlib.Path) -> None:
    data = _gzip_shard(tmp_path)
    corrupt = bytearray(data)
    corrupt[len(data) // 2 : len(data) // 2 + 8] = b"\xff" * 8
    for name, broken in [("corrupt", bytes(corrupt)), ("cut", data[: len(data) * 2 // 3])]:
        path = _write(tmp_path, broken, f"{name}.tar.gz")
        with pytest.raises(ShardFormatError, match=rf"{name}\.tar\.gz: .*gzip|truncated|header"):
            _read_file(path)


@pytest.mark.slow
@pytest.mark.parametrize("with_index", [True, False], ids=["index", "walk"])
def test_skip_drops_only_the_broken_part_and_keeps_batch_counts(
    tmp_path: pathlib.Path, with_index: bool
) -> None:
    root, manifest = make_dataset(tmp_path, num_samples=40, per_shard=8)
    broken = root / manifest.shards[1].name  # samples s000008..s000015
    data = bytearray(broken.read_bytes())
    with open(broken, "rb") as stream:
        offset = [o for _, o in iter_samples(open_tar(stream, str(broken)))][2]
    # The first header of s000010 now declares 8 GiB (checksum fixed: it parses).
    header = bytearray(data[offset : offset + 512])
    header[124:136] = b"77777777777\0"
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    data[offset : offset + 512] = header
    broken.write_bytes(bytes(data))
    if not with_index:
        (root / manifest.shards[1].index).unlink()
    # Batches of 8 from runs of 4 (one unit each): a batch of only broken samples (which
    # raises: it cannot be collated) is then all but impossible.
    ds = StreamingDataset(root, batch_size=8, on_error="skip", options=DICT)
    batches = list(torch_loader(ds))
    assert len(batches) == len(ds) == 5
    keys = keys_of(batches)
    assert len(keys) == len(set(keys))
    # With the index, runs (4 samples here) after the broken one read normally; a walk cannot
    # pass the broken header, and s000009 is dropped too (it may have had more members).
    lost = {10, 11} if with_index else set(range(9, 16))
    assert set(keys) == {f"s{i:06d}" for i in range(40) if i not in lost}


def torch_loader(ds: StreamingDataset):  # type: ignore[no-untyped-def]
    import torch.utils.data

    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)


def _manifest_text(tmp_path: pathlib.Path) -> dict:
    root, _ = make_dataset(tmp_path, num_samples=8, per_shard=4)
    return json.loads((root / "manifest.json").read_text())


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda d: d["shards"][0].update(num_samples=-3), "num_samples -3"),
        (lambda d: d["shards"][0].update(num_bytes="12"), "num_bytes '12'"),
        (lambda d: d["shards"][0].update(sha256="xyz"), "sha256 'xyz'"),
        (lambda d: d["shards"][0].update(name="../../etc/passwd"), "not a relative file name"),
        (lambda d: d["shards"][0].update(index="/abs.idx"), "not a relative file name"),
        (lambda d: d["shards"].append(d["shards"][0]), "lists a shard twice"),
        (lambda d: d.update(shards=[1, 2]), "malformed manifest"),
        (lambda d: d.update(settings="abc"), "malformed manifest"),
        (lambda d: d.update(class_names="abc"), "malformed manifest"),
    ],
)
def test_corrupt_manifests_are_clear_errors(tmp_path: pathlib.Path, change, message) -> None:  # type: ignore[no-untyped-def]
    document = _manifest_text(tmp_path)
    change(document)
    with pytest.raises(ManifestError, match=rf"^manifest\.json: .*{message}"):
        Manifest.from_json(json.dumps(document), where="manifest.json")


def test_a_mismatched_index_falls_back_to_walking_the_shard(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, manifest = make_dataset(tmp_path, num_samples=24, per_shard=8)
    from shardstream._format.shardindex import decode_offsets, encode_offsets

    # Shard 1's index ends elsewhere than the shard (an index of another build).
    index = root / manifest.shards[1].index
    offsets = decode_offsets(index.read_bytes(), "idx").tolist()
    index.write_bytes(encode_offsets([*offsets[:-1], offsets[-1] + 512]))
    other = root / manifest.shards[2].index
    other.write_bytes(other.read_bytes()[: -(8 * 16 + 8)])  # torn: its digests and a key hash
    ds = StreamingDataset(root, shuffle=False, options=DICT)
    assert sorted(keys_of(ds)) == [f"s{i:06d}" for i in range(24)]  # 0 workers: caplog sees it
    assert "shard-000001.idx: index says the samples end at byte" in caplog.text
    assert "shard-000002.idx: index of 152 bytes is torn (for 8 samples)" in caplog.text


def test_an_index_that_fits_but_lies_is_an_error_not_wrong_samples(tmp_path: pathlib.Path) -> None:
    from shardstream._format.shardindex import decode_offsets, encode_offsets

    root, manifest = make_dataset(tmp_path, num_samples=8, per_shard=8)
    index = root / manifest.shards[0].index
    offsets = decode_offsets(index.read_bytes(), "idx").tolist()
    offsets[3] += 512  # still increasing block boundaries, same count and end
    index.write_bytes(encode_offsets(offsets))
    ds = StreamingDataset(root, shuffle=False, options=DICT)
    with pytest.raises(ShardFormatError, match=r"shard-000000\.tar: .*index"):
        list(ds)
