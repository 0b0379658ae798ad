"""Manifest: versioned JSON round trip, clear errors, written atomically and last."""

from __future__ import annotations

import json
import pathlib

import pytest

from shardstream import ManifestError, ManifestNotFoundError
from shardstream._format.manifest import (
    MANIFEST_NAME,
    Manifest,
    ShardInfo,
    SkippedSample,
    read_manifest,
    write_manifest,
)


def make_manifest() -> Manifest:
    return Manifest(
        shards=(
            ShardInfo("shard-000000.tar", 3, 10240, "a" * 64),
            ShardInfo("shard-000001.tar", 2, 8192, "b" * 64),
        ),
        class_names=("cat", "dog"),
        settings={"seed": 0, "max_samples_per_shard": 3},
        skipped=(SkippedSample("cat/broken.jpg", "cannot identify image file"),),
        created_by="shardstream test",
    )


def test_round_trip_keeps_every_field(tmp_path: pathlib.Path) -> None:
    manifest = make_manifest()
    write_manifest(str(tmp_path), manifest)
    loaded = read_manifest(str(tmp_path))
    assert loaded == manifest
    assert loaded.num_samples == 5
    assert loaded.num_bytes == 18432


def test_json_is_stable_and_versioned() -> None:
    text = make_manifest().to_json()
    assert text == make_manifest().to_json()
    document = json.loads(text)
    assert document["format"] == "shardstream-manifest"
    assert document["format_version"] == 1
    assert document["num_samples"] == 5


def test_missing_manifest_says_the_build_is_unfinished(tmp_path: pathlib.Path) -> None:
    (tmp_path / "shard-000000.tar").write_bytes(b"\0" * 1024)
    with pytest.raises(ManifestNotFoundError, match="no manifest") as info:
        read_manifest(str(tmp_path))
    assert isinstance(info.value, FileNotFoundError)
    assert str(tmp_path) in str(info.value)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"format": "other"}', "not a shardstream manifest"),
        ('{"format": "shardstream-manifest", "format_version": 99, "shards": []}', "99"),
        ('{"format": "shardstream-manifest", "format_version": 1}', "malformed"),
    ],
)
def test_bad_manifests_are_rejected_clearly(
    tmp_path: pathlib.Path, document: str, message: str
) -> None:
    (tmp_path / MANIFEST_NAME).write_text(document)
    with pytest.raises(ManifestError, match=message):
        read_manifest(str(tmp_path))


def test_inconsistent_total_is_rejected() -> None:
    document = json.loads(make_manifest().to_json())
    document["num_samples"] = 6
    with pytest.raises(ManifestError, match="disagrees"):
        Manifest.from_json(json.dumps(document))


def test_manifest_on_an_fsspec_memory_filesystem() -> None:
    manifest = make_manifest()
    url = write_manifest("memory://datasets/one", manifest)
    assert url == "memory://datasets/one/manifest.json"
    assert read_manifest("memory://datasets/one") == manifest
