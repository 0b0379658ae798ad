"""Shard limits hold for any source and options; verify catches damaged shards."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from shardstream._format.tarformat import TarShardWriter, member_header
from shardstream.errors import ChecksumMismatchError
from shardstream.shardwriter import build_shards, verify_dataset

from ..conftest import encode_image


def _samples(sizes: list[int]):
    for index, size in enumerate(sizes):
        yield {"__key__": f"k{index:04d}", "bin": bytes([index % 256]) * size, "cls": index}


@pytest.mark.parametrize("seed", range(6))
def test_limits_hold_for_random_sizes(tmp_path, seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 20_000, size=int(rng.integers(1, 60))).tolist()
    max_bytes = int(rng.integers(8_192, 60_000))
    max_samples = int(rng.integers(1, 12))
    manifest = build_shards(
        _samples(sizes),
        tmp_path / "out",
        max_bytes_per_shard=max_bytes,
        max_samples_per_shard=max_samples,
    )
    assert manifest.num_samples == len(sizes)
    for shard in manifest.shards:
        assert 1 <= shard.num_samples <= max_samples
        assert shard.num_bytes == (tmp_path / "out" / shard.name).stat().st_size
        if shard.num_samples > 1:
            assert shard.num_bytes <= max_bytes
    verify_dataset(str(tmp_path / "out"))


def test_oversize_sample_gets_its_own_shard_with_a_warning(make_image_folder, tmp_path, caplog):
    root = make_image_folder(num_classes=1, per_class=4, size=(16, 16), png_every=0)
    (root / "class_00" / "big.png").write_bytes(encode_image(300, 300, seed=5, fmt="PNG"))
    manifest = build_shards(root, tmp_path / "out", max_bytes_per_shard=20_000, shuffle=False)
    assert any("own" in record.message for record in caplog.records)
    big = [s for s in manifest.shards if s.num_bytes > 20_000]
    assert len(big) == 1 and big[0].num_samples == 1
    assert all(s.num_bytes <= 20_000 for s in manifest.shards if s.name != big[0].name)


def test_file_source_shards_fill_exactly_as_planned(make_image_folder, tmp_path):
    root = make_image_folder(num_classes=3, per_class=20, png_every=4)
    manifest = build_shards(root, tmp_path / "out", max_bytes_per_shard=12_000)
    assert all(s.num_bytes <= 12_000 for s in manifest.shards)
    # Greedy filling: no two neighbouring shards could have been merged.
    sizes = [s.num_bytes for s in manifest.shards]
    assert all(a + b - 1024 > 12_000 for a, b in itertools.pairwise(sizes))


def test_long_and_unicode_names_round_trip(tmp_path):
    import tarfile

    key = "deep/" + "x" * 120 + "/naïve_ünïcode"
    build_shards([{"__key__": key, "txt": "hello"}], tmp_path / "out")
    with tarfile.open(tmp_path / "out" / "shard-000000.tar") as archive:
        assert archive.getnames() == [key + ".txt"]
    verify_dataset(str(tmp_path / "out"))
    assert len(member_header(key + ".txt", 5)) > 512


def test_writer_counts_end_blocks():
    import io

    stream = io.BytesIO()
    writer = TarShardWriter(stream)
    writer.write_member("a.txt", b"x" * 513)
    writer.finish()
    assert writer.num_bytes == len(stream.getvalue()) == 512 + 1024 + 1024


def test_verify_catches_a_flipped_byte_and_a_truncated_shard(image_folder, tmp_path):
    dest = tmp_path / "out"
    build_shards(image_folder, dest, max_samples_per_shard=5)
    verify_dataset(str(dest))
    flipped = dest / "shard-000000.tar"
    data = bytearray(flipped.read_bytes())
    data[1500] ^= 0xFF
    flipped.write_bytes(bytes(data))
    truncated = dest / "shard-000001.tar"
    truncated.write_bytes(truncated.read_bytes()[:3000])
    with pytest.raises(ChecksumMismatchError) as caught:
        verify_dataset(str(dest))
    message = str(caught.value)
    assert "shard-000000.tar: sha256 expected" in message
    assert "shard-000001.tar: size expected" in message
    assert "shard-000002.tar" not in message
