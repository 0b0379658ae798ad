"""Other readers on shardstream shards, unchanged: timm's ``wds/`` reader and HF ``datasets``.

timm finds shards and sample counts in the ``_info.json`` that ``build_shards`` writes next to
the manifest; Hugging Face's packaged ``webdataset`` loader reads the tar files alone. Both are
the real libraries, run offline.
"""

from __future__ import annotations

import collections
import gc
import hashlib
import io
import json
import logging
import pathlib
import re
import warnings
from typing import Any

import pytest
from PIL import Image

from shardstream._format.inspection import TIMM_INFO_NAME, timm_info_json, write_timm_info
from shardstream._format.manifest import Manifest
from shardstream.errors import ConfigError
from shardstream.shardwriter import _build as build
from shardstream.shardwriter import build_shards

from ..conftest import encode_image
from .helpers import dataset_bytes, tar_members

#: The exact bytes for the 12-image tree in 3 shards: sorted keys, no timestamps or paths.
THREE_SHARDS_INFO_JSON = """\
{
 "splits": {
  "train": {
   "filenames": [
    "shard-000000.tar",
    "shard-000001.tar",
    "shard-000002.tar"
   ],
   "name": "train",
   "num_samples": 12,
   "shard_lengths": [
    5,
    5,
    2
   ]
  }
 }
}
"""

#: (label, sha256 of the RGB pixels): identifies a sample whatever a reader calls it.
Fingerprint = tuple[int, str]


def _fingerprint(label: int, image: Image.Image) -> Fingerprint:
    return label, hashlib.sha256(image.convert("RGB").tobytes()).hexdigest()


def _source_fingerprints(root: pathlib.Path) -> collections.Counter[Fingerprint]:
    """What any reader must yield for an ImageFolder tree: class index and decoded pixels."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    found: collections.Counter[Fingerprint] = collections.Counter()
    for path in root.rglob("*"):
        if path.is_file():
            label = classes.index(path.relative_to(root).parts[0])
            with Image.open(path) as image:
                found[_fingerprint(label, image)] += 1
    return found


def _expected_info(manifest: Manifest) -> dict[str, Any]:
    return {
        "splits": {
            "train": {
                "name": "train",
                "num_samples": manifest.num_samples,
                "filenames": [shard.name for shard in manifest.shards],
                "shard_lengths": [shard.num_samples for shard in manifest.shards],
            }
        }
    }


def _read_info(dest: pathlib.Path) -> dict[str, Any]:
    return dict(json.loads((dest / TIMM_INFO_NAME).read_text("utf-8")))


def test_info_json_lists_every_shard_of_the_manifest(image_folder, tmp_path):
    dest = tmp_path / "out"
    manifest = build_shards(image_folder, dest, max_samples_per_shard=5)
    text = (dest / TIMM_INFO_NAME).read_text("utf-8")
    assert json.loads(text) == _expected_info(manifest)
    assert text == THREE_SHARDS_INFO_JSON
    info = json.loads(text)["splits"]["train"]
    assert info["filenames"] == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert info["shard_lengths"] == [s.num_samples for s in manifest.shards] == [5, 5, 2]
    assert info["num_samples"] == 12
    shard_files = [name for s in manifest.shards for name in (s.name, s.index) if name]
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        ["manifest.json", TIMM_INFO_NAME, *shard_files]
    )


def test_labels_are_ascii_integers_as_timm_reads_them(image_folder, tmp_path):
    manifest = build_shards(image_folder, tmp_path / "out", max_samples_per_shard=5)
    labels = [
        data
        for shard in manifest.shards
        for name, data in tar_members(tmp_path / "out" / shard.name)
        if name.endswith(".cls")
    ]
    assert len(labels) == 12 and all(re.fullmatch(rb"[0-9]+", label) for label in labels)


def test_iterable_sources_get_info_json_too(tmp_path):
    samples = [{"__key__": f"s{i}", "jpg": encode_image(8, 8, i), "cls": i % 2} for i in range(5)]
    manifest = build_shards(samples, tmp_path / "out", max_samples_per_shard=2)
    info = _read_info(tmp_path / "out")
    assert info == _expected_info(manifest)
    assert info["splits"]["train"]["shard_lengths"] == [2, 2, 1]


def test_rerun_of_a_finished_build_leaves_info_json_untouched(image_folder, tmp_path):
    dest = tmp_path / "out"
    build_shards(image_folder, dest, max_samples_per_shard=5)
    before = {p.name: p.stat().st_mtime_ns for p in dest.iterdir()}
    build_shards(image_folder, dest, max_samples_per_shard=5)
    assert {p.name: p.stat().st_mtime_ns for p in dest.iterdir()} == before


def test_build_stopped_before_its_manifest_resumes_to_identical_bytes(
    image_folder, tmp_path, monkeypatch
):
    build_shards(image_folder, tmp_path / "clean", max_samples_per_shard=5)
    dest = tmp_path / "stopped"

    def stop(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt("stopped just before the manifest")

    with monkeypatch.context() as patch:
        patch.setattr(build, "write_manifest", stop)
        with pytest.raises(KeyboardInterrupt):
            build_shards(image_folder, dest, max_samples_per_shard=5)
    # The timm file is complete before the manifest exists, and is no reason to refuse a resume.
    assert not (dest / "manifest.json").exists()
    clean_info = (tmp_path / "clean" / TIMM_INFO_NAME).read_bytes()
    assert (dest / TIMM_INFO_NAME).read_bytes() == clean_info
    build_shards(image_folder, dest, max_samples_per_shard=5)
    assert dataset_bytes(dest) == dataset_bytes(tmp_path / "clean")


def test_overwrite_replaces_info_json_as_part_of_the_dataset(image_folder, tmp_path, caplog):
    dest = tmp_path / "out"
    build_shards(image_folder, dest, max_samples_per_shard=5)
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        replaced = build_shards(image_folder, dest, max_samples_per_shard=4, overwrite=True)
    assert "unrelated" not in caplog.text, "_info.json was taken for a foreign file"
    info = _read_info(dest)
    assert info == _expected_info(replaced)
    assert info["splits"]["train"]["shard_lengths"] == [4, 4, 4]


def test_split_names_that_timm_reads_as_shard_patterns_are_refused(image_folder, tmp_path):
    manifest = build_shards(image_folder, tmp_path / "out", max_samples_per_shard=5)
    for split in ("", "start", "a..b"):
        with pytest.raises(ConfigError, match="shard pattern"):
            timm_info_json(manifest, split)
    write_timm_info(tmp_path / "out", manifest, split="validation")
    info = _read_info(tmp_path / "out")
    assert list(info["splits"]) == ["validation"]
    assert info["splits"]["validation"]["name"] == "validation"


@pytest.fixture
def offline_hf(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """Keep timm's and HF's hub clients offline, with every cache under ``tmp_path``."""
    home = tmp_path / "hf-home"
    for name, value in {
        "HF_HOME": str(home),
        "HF_DATASETS_CACHE": str(home / "datasets"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }.items():
        monkeypatch.setenv(name, value)
    # Both libraries read these once, at import: set them again in case an import came first.
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return home


def _read_with_timm(dest: pathlib.Path, is_training: bool) -> tuple[list[Fingerprint], int]:
    from timm.data import create_dataset

    dataset = create_dataset(
        "wds/shardstream", root=str(dest), split="train", is_training=is_training, batch_size=1
    )
    # webdataset 1.0 leaves shard files to the garbage collector: collect them here, with only
    # that warning silenced, so that it cannot fail a later test (as in helpers.py).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"unclosed file .*\.tar'", ResourceWarning)
        found = [_fingerprint(int(label), image) for image, label in dataset]
        length = len(dataset)
        del dataset
        gc.collect()
    return found, length


def test_timm_wds_reader_reads_every_sample_with_its_label(image_folder, tmp_path, offline_hf):
    dest = tmp_path / "out"
    manifest = build_shards(image_folder, dest, max_samples_per_shard=5)
    expected = _source_fingerprints(image_folder)
    assert sum(expected.values()) == manifest.num_samples == 12
    # Evaluation order: every shard once, in manifest order, in this process (no workers).
    found, length = _read_with_timm(dest, is_training=False)
    assert collections.Counter(found) == expected and length == 12
    # Training needs the sample count from _info.json; one epoch of 12 is one full pass.
    found, length = _read_with_timm(dest, is_training=True)
    assert collections.Counter(found) == expected and length == 12


def test_hugging_face_webdataset_loader_reads_every_key(
    make_image_folder, tmp_path, offline_hf, monkeypatch
):
    import datasets

    # HF takes its columns from the first samples, so a dataset needs one image type (all
    # JPEG here; mixed trees can be built with `quality=` to re-encode them all to JPEG).
    root = make_image_folder(num_classes=3, per_class=4, png_every=0)
    dest = tmp_path / "out"
    build_shards(root, dest, max_samples_per_shard=5)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    loaded = datasets.load_dataset(
        "webdataset",
        data_files={"train": sorted(str(p) for p in dest.glob("*.tar"))},
        split="train",
        cache_dir=str(offline_hf / "cache"),
    )
    originals = {
        str(p.relative_to(root).with_suffix("")): p for p in root.rglob("*.jpg") if p.is_file()
    }
    assert sorted(loaded["__key__"]) == sorted(originals)
    classes = sorted(p.name for p in root.iterdir())
    for row in loaded:
        path = originals[row["__key__"]]
        assert row["cls"] == classes.index(path.relative_to(root).parts[0])
        with Image.open(io.BytesIO(path.read_bytes())) as original:
            assert _fingerprint(0, row["jpg"]) == _fingerprint(0, original)
