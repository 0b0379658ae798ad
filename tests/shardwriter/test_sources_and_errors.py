"""Sources (ImageFolder, CSV, JSONL, iterables) and the errors bad input gives."""

from __future__ import annotations

import json
import pathlib

import pytest

from shardstream.errors import DatasetExistsError, DuplicateKeyError, SourceError
from shardstream.shardwriter import build_shards

from ..conftest import encode_image
from .helpers import manifest_of, read_with_webdataset


def _write_list_images(root: pathlib.Path, count: int) -> list[str]:
    (root / "pics").mkdir(parents=True)
    names = []
    for index in range(count):
        name = f"pics/p{index}.jpg"
        (root / name).write_bytes(encode_image(16, 16, seed=index))
        names.append(name)
    return names


def test_csv_source_with_class_names_and_extra_fields(tmp_path):
    names = _write_list_images(tmp_path, 4)
    rows = ["path,label,caption"] + [
        f"{n},{'dog' if i % 2 else 'cat'},caption {i}" for i, n in enumerate(names)
    ]
    (tmp_path / "list.csv").write_text("\n".join(rows) + "\n")
    manifest = build_shards(tmp_path / "list.csv", tmp_path / "out")
    assert manifest.class_names == ("cat", "dog")
    samples = {s["__key__"]: s for s in read_with_webdataset(tmp_path / "out")}
    assert set(samples) == {"pics/p0", "pics/p1", "pics/p2", "pics/p3"}
    assert int(samples["pics/p1"]["cls"]) == 1 and int(samples["pics/p2"]["cls"]) == 0
    assert json.loads(samples["pics/p3"]["json"]) == {"caption": "caption 3"}
    assert samples["pics/p0"]["jpg"] == (tmp_path / "pics/p0.jpg").read_bytes()


def test_jsonl_source_with_integer_labels_and_keys(tmp_path):
    names = _write_list_images(tmp_path, 3)
    lines = [
        json.dumps({"path": n, "label": i, "key": f"k/{i}", "meta": {"i": i}})
        for i, n in enumerate(names)
    ]
    (tmp_path / "list.jsonl").write_text("\n".join(lines) + "\n")
    manifest = build_shards(tmp_path / "list.jsonl", tmp_path / "out")
    assert manifest.class_names is None
    samples = {s["__key__"]: s for s in read_with_webdataset(tmp_path / "out")}
    assert sorted(samples) == ["k/0", "k/1", "k/2"]
    assert json.loads(samples["k/2"]["json"]) == {"meta": {"i": 2}}
    assert int(samples["k/2"]["cls"]) == 2


def test_iterable_source_keeps_order_and_encodes_fields(tmp_path):
    samples = (
        {"__key__": f"s/{i:03d}", "jpg": encode_image(8, 8, seed=i), "cls": i % 3, "json": {"i": i}}
        for i in range(25)
    )
    manifest = build_shards(samples, tmp_path / "out", max_samples_per_shard=10)
    assert [s.num_samples for s in manifest.shards] == [10, 10, 5]
    read = read_with_webdataset(tmp_path / "out")
    assert [s["__key__"] for s in read] == [f"s/{i:03d}" for i in range(25)]
    assert json.loads(read[7]["json"]) == {"i": 7} and read[7]["cls"] == b"1"


def test_key_with_a_dot_names_the_file(make_image_folder, tmp_path):
    root = make_image_folder(num_classes=1, per_class=1)
    (root / "class_00" / "img.v2.jpg").write_bytes(encode_image(8, 8, seed=1))
    with pytest.raises(SourceError, match=r"img\.v2\.jpg.*contains a '\.'"):
        build_shards(root, tmp_path / "out")


def test_duplicate_keys_in_a_folder_name_both_files(make_image_folder, tmp_path):
    root = make_image_folder(num_classes=1, per_class=1, png_every=0)
    (root / "class_00" / "img_00000.png").write_bytes(encode_image(8, 8, seed=1, fmt="PNG"))
    with pytest.raises(DuplicateKeyError, match=r"img_00000\.jpg.*img_00000\.png"):
        build_shards(root, tmp_path / "out")


def test_duplicate_keys_in_a_csv(tmp_path):
    names = _write_list_images(tmp_path, 2)
    (tmp_path / "list.csv").write_text(f"path,label\n{names[0]},0\n{names[1]},1\n{names[0]},1\n")
    with pytest.raises(DuplicateKeyError, match="p0"):
        build_shards(tmp_path / "list.csv", tmp_path / "out")


def test_empty_source(tmp_path):
    (tmp_path / "empty" / "class_a").mkdir(parents=True)
    (tmp_path / "empty" / "class_a" / "notes.txt").write_text("not an image")
    with pytest.raises(SourceError, match="no image files"):
        build_shards(tmp_path / "empty", tmp_path / "out")
    with pytest.raises(SourceError, match="no samples"):
        build_shards(iter(()), tmp_path / "out2")


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_image_raises_naming_the_file(make_image_folder, tmp_path, damage):
    root = make_image_folder(num_classes=2, per_class=3, png_every=0)
    bad = root / "class_01" / "img_00003.jpg"
    data = bad.read_bytes()
    bad.write_bytes(b"not a jpeg at all" if damage == "garbage" else data[: len(data) // 2])
    with pytest.raises(SourceError, match=r"img_00003\.jpg.*(not a JPEG|truncated)"):
        build_shards(root, tmp_path / "out")


def test_skip_counts_and_lists_bad_files(make_image_folder, tmp_path):
    root = make_image_folder(num_classes=2, per_class=3, png_every=0)
    (root / "class_01" / "img_00003.jpg").write_bytes(b"garbage")
    manifest = build_shards(root, tmp_path / "out", on_error="skip", max_samples_per_shard=2)
    assert manifest.num_samples == 5
    assert len(manifest.skipped) == 1
    assert manifest.skipped[0].source.endswith("img_00003.jpg")
    assert "not a JPEG" in manifest.skipped[0].reason
    assert all(s.num_samples > 0 for s in manifest.shards)


def test_rerun_is_idempotent_and_other_settings_are_refused(image_folder, tmp_path):
    dest = tmp_path / "out"
    first = build_shards(image_folder, dest, max_samples_per_shard=5)
    mtimes = {p.name: p.stat().st_mtime_ns for p in dest.iterdir()}
    assert build_shards(image_folder, dest, max_samples_per_shard=5) == first
    assert {p.name: p.stat().st_mtime_ns for p in dest.iterdir()} == mtimes
    with pytest.raises(DatasetExistsError, match="max_samples_per_shard: found 5, asked 4"):
        build_shards(image_folder, dest, max_samples_per_shard=4)
    replaced = build_shards(image_folder, dest, max_samples_per_shard=4, overwrite=True)
    assert manifest_of(dest) == replaced and len(replaced.shards) == 3
    assert sorted(p.name for p in dest.iterdir()) == [
        "_info.json",
        "manifest.json",
        *sorted(name for s in replaced.shards for name in (s.name, s.index)),
    ]


def test_destination_with_unrelated_files_is_refused(image_folder, tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "precious.txt").write_text("keep me")
    with pytest.raises(DatasetExistsError, match=r"precious\.txt"):
        build_shards(image_folder, dest)
    assert (dest / "precious.txt").read_text() == "keep me"
