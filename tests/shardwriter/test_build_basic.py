"""End-to-end builds from ImageFolder trees, read back with the webdataset library."""

from __future__ import annotations

import itertools
import pathlib
import tarfile

import pytest

from shardstream._format.manifest import read_manifest
from shardstream.errors import ManifestNotFoundError
from shardstream.shardwriter import BuildOptions, build_shards

from .helpers import dataset_bytes, read_with_webdataset, tar_members


def _source_files(root: pathlib.Path) -> dict[str, bytes]:
    """key -> original bytes for every image in a tree."""
    files = {}
    for path in root.rglob("*"):
        if path.is_file():
            key = str(path.relative_to(root).with_suffix(""))
            files[key] = path.read_bytes()
    return files


def test_round_trip_with_webdataset_is_byte_identical(image_folder, tmp_path):
    manifest = build_shards(image_folder, tmp_path / "out", max_samples_per_shard=5)
    originals = _source_files(image_folder)
    samples = read_with_webdataset(tmp_path / "out")
    assert len(samples) == len(originals) == manifest.num_samples == 12
    assert manifest.class_names == ("class_00", "class_01", "class_02")
    for sample in samples:
        key = sample["__key__"]
        image = sample.get("jpg", sample.get("png"))
        assert image == originals[key], key
        assert int(sample["cls"]) == int(key[len("class_") : len("class_") + 2])
    assert {s.name for s in manifest.shards} == {
        "shard-000000.tar",
        "shard-000001.tar",
        "shard-000002.tar",
    }


def test_manifest_records_sizes_hashes_and_settings(image_folder, tmp_path):
    import hashlib

    dest = tmp_path / "out"
    manifest = build_shards(image_folder, dest, max_samples_per_shard=5, seed=7)
    assert read_manifest(str(dest)) == manifest
    for shard in manifest.shards:
        data = (dest / shard.name).read_bytes()
        assert shard.num_bytes == len(data)
        assert shard.sha256 == hashlib.sha256(data).hexdigest()
    assert manifest.settings["seed"] == 7
    assert manifest.settings["max_samples_per_shard"] == 5
    assert manifest.settings["source_kind"] == "imagefolder"
    assert sorted(p.name for p in dest.iterdir()) == [
        "_info.json",
        "manifest.json",
        *sorted(name for s in manifest.shards for name in (s.name, s.index)),
    ]


def test_tar_headers_are_deterministic_and_gnu_tar_compatible(image_folder, tmp_path):
    build_shards(image_folder, tmp_path / "out", max_samples_per_shard=100)
    path = tmp_path / "out" / "shard-000000.tar"
    with tarfile.open(path) as archive:
        members = archive.getmembers()
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.mode == 0o644 for m in members)
    assert all(m.uname == "" and m.gname == "" for m in members)
    names = [m.name for m in members]
    keys = [n.split(".", 1)[0] for n in names]
    # Members of one sample are contiguous and in sorted extension order.
    for first, second in itertools.pairwise(names):
        if first.split(".", 1)[0] == second.split(".", 1)[0]:
            assert first < second
    assert len(set(keys)) == 12
    assert path.stat().st_size % 512 == 0


def test_shuffle_mixes_classes_and_is_seeded(make_image_folder, tmp_path):
    root = make_image_folder(num_classes=4, per_class=25, png_every=0, nested=False)
    first = build_shards(root, tmp_path / "a", max_samples_per_shard=10, seed=1)
    again = build_shards(root, tmp_path / "b", max_samples_per_shard=10, seed=1)
    other = build_shards(root, tmp_path / "c", max_samples_per_shard=10, seed=2)
    assert dataset_bytes(tmp_path / "a") == {k: v for k, v in dataset_bytes(tmp_path / "b").items()}
    assert first.shards == again.shards and first.shards != other.shards
    for shard in first.shards:
        labels = {name.split("/")[0] for name, _ in tar_members(tmp_path / "a" / shard.name)}
        assert len(labels) >= 2, "a shard holds a single class: the source was not shuffled"


def test_no_shuffle_keeps_source_order(image_folder, tmp_path):
    build_shards(image_folder, tmp_path / "out", shuffle=False)
    keys = [s["__key__"] for s in read_with_webdataset(tmp_path / "out")]
    assert keys[:3] == ["class_00/img_00000", "class_00/img_00002", "class_00/sub/img_00001"]


def test_options_object_and_overrides(image_folder, tmp_path):
    options = BuildOptions(max_samples_per_shard=4)
    manifest = build_shards(image_folder, tmp_path / "out", options, seed=3)
    assert [s.num_samples for s in manifest.shards] == [4, 4, 4]
    assert manifest.settings["seed"] == 3


def test_reader_without_manifest_says_so(tmp_path):
    (tmp_path / "half").mkdir()
    with pytest.raises(ManifestNotFoundError, match="no manifest"):
        read_manifest(str(tmp_path / "half"))


def test_resize_writes_jpeg_with_requested_shorter_side(make_image_folder, tmp_path):
    import io

    from PIL import Image

    root = make_image_folder(num_classes=2, per_class=3, size=(80, 40), png_every=2)
    build_shards(root, tmp_path / "out", resize=20, quality=80)
    samples = read_with_webdataset(tmp_path / "out")
    assert len(samples) == 6
    for sample in samples:
        assert set(sample) == {"__key__", "jpg", "cls"}
        image = Image.open(io.BytesIO(sample["jpg"]))
        assert image.format == "JPEG"
        assert image.size == (40, 20)


def test_memory_filesystem_destination(image_folder):
    import fsspec

    manifest = build_shards(image_folder, "memory://writer-test/out", max_samples_per_shard=5)
    fs = fsspec.filesystem("memory")
    # Only files count: memory:// keeps an empty pseudo-folder where the build state was.
    names = sorted(
        e["name"].rsplit("/", 1)[-1]
        for e in fs.ls("/writer-test/out", detail=True)
        if e["type"] == "file"
    )
    assert names == [
        "_info.json",
        "manifest.json",
        *sorted(name for s in manifest.shards for name in (s.name, s.index)),
    ]
    assert read_manifest("memory://writer-test/out") == manifest
    fs.rm("/writer-test", recursive=True)
