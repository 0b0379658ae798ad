"""The per-sample byte-offset index (``shard-NNNNNN.idx``): written, verified, resumed."""

from __future__ import annotations

import logging

import pytest

from shardstream._format.shardindex import decode_offsets, encode_offsets, index_name
from shardstream._format.tarreader import iter_samples, open_tar
from shardstream._format.verify import verify_dataset
from shardstream.errors import ChecksumMismatchError, ShardFormatError
from shardstream.shardwriter import _state as state
from shardstream.shardwriter import build_shards

from .helpers import dataset_bytes


def test_encode_decode_and_bad_files_are_named() -> None:
    assert index_name("shard-000007.tar") == "shard-000007.idx"
    data = encode_offsets([0, 1536, 4096, 9216])
    assert decode_offsets(data, "x.idx", num_samples=3).tolist() == [0, 1536, 4096, 9216]
    with pytest.raises(ShardFormatError, match=r"x\.idx: not a shardstream index"):
        decode_offsets(b"garbage" * 4, "x.idx")
    with pytest.raises(ShardFormatError, match="torn"):
        decode_offsets(data[:-3], "x.idx")
    with pytest.raises(ShardFormatError, match="go backwards"):
        decode_offsets(encode_offsets([0, 2048, 1024]), "x.idx")
    with pytest.raises(ShardFormatError, match="lists 3 samples, the manifest 4"):
        decode_offsets(data, "x.idx", num_samples=4)


def test_index_round_trip_matches_the_tar(image_folder, tmp_path) -> None:
    dest = tmp_path / "out"
    manifest = build_shards(image_folder, dest, max_samples_per_shard=5)
    for shard in manifest.shards:
        assert shard.index == index_name(shard.name)
        offsets = decode_offsets((dest / shard.index).read_bytes(), shard.index)
        with open(dest / shard.name, "rb") as stream:
            walked = [offset for _, offset in iter_samples(open_tar(stream, shard.name))]
        assert offsets.tolist() == [*walked, shard.num_bytes - 1024]


def test_verify_reports_a_corrupted_or_missing_index(image_folder, tmp_path) -> None:
    dest = tmp_path / "out"
    manifest = build_shards(image_folder, dest, max_samples_per_shard=5)
    verify_dataset(str(dest))
    first, second = manifest.shards[0], manifest.shards[1]
    offsets = decode_offsets((dest / first.index).read_bytes(), first.index).tolist()
    offsets[2] += 512
    (dest / first.index).write_bytes(encode_offsets(offsets))
    (dest / second.index).unlink()
    with pytest.raises(ChecksumMismatchError) as raised:
        verify_dataset(str(dest))
    message = str(raised.value)
    assert f"{first.index}: entry 2 says byte offset {offsets[2]}" in message
    assert f"{second.index}: index missing" in message


def test_resume_rebuilds_a_chunk_whose_index_is_missing(
    make_image_folder, tmp_path, monkeypatch, caplog
) -> None:
    root = make_image_folder(num_classes=3, per_class=8)
    build_shards(root, tmp_path / "whole", max_samples_per_shard=4, workers=1)
    dest = tmp_path / "out"

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(state, "finalize_shards", interrupted)
        with pytest.raises(KeyboardInterrupt):
            build_shards(root, dest, max_samples_per_shard=4, workers=1)
    folder = dest / state.STATE_FOLDER
    indexes = sorted(folder.glob("chunk-*.idx"))
    assert indexes and len(indexes) == len(list(folder.glob("chunk-*.tar")))
    indexes[0].unlink()
    num_chunks = len(list(folder.glob("chunk-*.json")))
    with caplog.at_level(logging.INFO, logger="shardstream"):
        build_shards(root, dest, max_samples_per_shard=4, workers=1)
    assert f"{num_chunks - 1} of {num_chunks} chunks already written" in caplog.text
    assert dataset_bytes(dest) == dataset_bytes(tmp_path / "whole")
