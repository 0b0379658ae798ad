"""Content digests in the per-sample index (version 3): written by the build and by `index`
where the bytes pass, equal for equal content whatever the key or labels, checked by verify;
version 1 and 2 indexes stay readable, and readers read only offsets and keys."""

from __future__ import annotations

import pathlib

import pytest
import webdataset as wds

from shardstream import build_shards, index_shards
from shardstream._format.keys import sample_digest
from shardstream._format.shardindex import (
    decode_index,
    encode_offsets,
    index_key_hashes,
    index_version,
)
from shardstream._format.tarreader import iter_samples, open_tar
from shardstream._format.verify import verify_dataset
from shardstream._storage import Store
from shardstream.errors import ChecksumMismatchError, ShardFormatError
from shardstream.streaming._worker.pieces import IndexCache
from tests.streaming.shards import tiny_jpeg


def _digests_of_tar(path: pathlib.Path) -> dict[str, bytes]:
    """Each sample's key and digest, computed from the tar by the reader's grouping."""
    with open(path, "rb") as stream:
        samples = iter_samples(open_tar(stream, "x"))
        return {sample["__key__"]: sample_digest(sample) for sample, _ in samples}


def _samples() -> list[dict]:
    """Ten samples: 6 and 7 copy 1's image under other keys and labels; 8 copies 2 wholly."""
    samples = [{"__key__": f"k{i}", "jpg": tiny_jpeg(i), "cls": i, "json": {"i": i}}
               for i in range(10)]  # fmt: skip
    samples[6]["jpg"] = samples[7]["jpg"] = samples[1]["jpg"]
    samples[8] = {**samples[2], "__key__": "k8"}
    return samples


def test_a_build_stores_digests_equal_for_equal_content(tmp_path: pathlib.Path) -> None:
    manifest = build_shards(_samples(), tmp_path / "ds", max_samples_per_shard=4)
    digests: dict[str, bytes] = {}
    for shard in manifest.shards:
        data = (tmp_path / "ds" / (shard.index or "")).read_bytes()
        index = decode_index(data, shard.index or "", shard.num_samples)
        assert index_version(data) == 3 and index.digests is not None
        found = _digests_of_tar(tmp_path / "ds" / shard.name)
        assert [bytes(d) for d in index.digests] == list(found.values())
        digests.update(found)
    assert digests["k1"] == digests["k6"] == digests["k7"]  # labels and json differ: same image
    assert digests["k2"] == digests["k8"]
    assert len(set(digests.values())) == 7
    assert verify_dataset(tmp_path / "ds").num_samples == 10


def test_old_indexes_read_and_readers_read_only_offsets_and_keys(tmp_path: pathlib.Path) -> None:
    offsets, keys = [0, 1024, 3072], [11, 12]
    two = encode_offsets(offsets, keys)
    three = encode_offsets(offsets, keys, [bytes(16), b"\1" * 16])
    assert decode_index(two, "x").digests is None and index_key_hashes(two, "x").tolist() == keys
    assert decode_index(encode_offsets(offsets), "x").key_hashes is None
    assert index_key_hashes(three, "x").tolist() == keys
    assert decode_index(three, "x").digests.tolist()[1] == [1] * 16
    with pytest.raises(ShardFormatError, match="torn"):
        decode_index(three[:-5], "x")
    with pytest.raises(ShardFormatError, match="lists 2 samples, the manifest 3"):
        decode_index(three, "x", num_samples=3)
    (tmp_path / "a.idx").write_bytes(three)
    read = IndexCache(Store(str(tmp_path))).get("a.idx", num_samples=2, num_bytes=4096)
    assert read is not None and list(read.offsets) == offsets and read.digests is None


def test_index_digests_foreign_shards_and_verify_finds_a_changed_digest(
    tmp_path: pathlib.Path,
) -> None:
    folder = tmp_path / "wds"
    folder.mkdir()
    with wds.ShardWriter(str(folder / "part-%05d.tar"), maxcount=4) as sink:
        for sample in _samples():
            sink.write(sample)
    manifest = index_shards(folder)
    first = manifest.shards[0]
    data = (folder / (first.index or "")).read_bytes()
    assert index_version(data) == 3
    index = decode_index(data, "x")
    assert [bytes(d) for d in index.digests] == list(_digests_of_tar(folder / first.name).values())
    assert bytes(index.digests[1]) == sample_digest(_samples()[1])  # the same rule as a build
    tampered = bytearray(data)
    tampered[-1] ^= 1
    (folder / (first.index or "")).write_bytes(bytes(tampered))
    with pytest.raises(ChecksumMismatchError, match="sample 3's content digest differs"):
        verify_dataset(folder)
    unread = tmp_path / "unread"
    index_shards(folder, unread, checksum=False)  # bytes hopped over: no digests
    assert index_version((unread / (first.index or "")).read_bytes()) == 2


def test_version_4_adds_pixel_sizes_that_readers_need_not_read(tmp_path: pathlib.Path) -> None:
    offsets, keys, digests = [0, 1024, 3072], [11, 12], [bytes(16), b"\1" * 16]
    four = encode_offsets(offsets, keys, digests, [(256, 341), (300, 256)])
    assert index_version(four) == 4 and index_key_hashes(four, "x").tolist() == keys
    whole = decode_index(four, "x")
    assert whole.shapes.tolist() == [[256, 341], [300, 256]]
    assert whole.digests.tolist()[1] == [1] * 16 and list(whole.offsets) == offsets
    no_shapes = decode_index(four[: -4 * 2], "x")  # read up to the digests
    assert no_shapes.shapes is None and no_shapes.digests is not None
    with pytest.raises(ShardFormatError, match="torn"):
        decode_index(four[:-3], "x")
    with pytest.raises(ValueError, match="one shape per sample"):
        encode_offsets(offsets, keys, digests, [(1, 1)])
    with pytest.raises(ValueError, match="needs digests"):
        encode_offsets(offsets, keys, None, [(1, 1), (2, 2)])
    (tmp_path / "a.idx").write_bytes(four)
    read = IndexCache(Store(str(tmp_path))).get("a.idx", num_samples=2, num_bytes=4096)
    assert read is not None and list(read.offsets) == offsets  # a worker reads offsets and keys
