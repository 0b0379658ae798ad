"""Round trip through the project's own reader: build_shards -> StreamingDataset."""

from __future__ import annotations

import pathlib

import pytest

from shardstream.shardwriter import build_shards


def test_streaming_dataset_reads_every_sample_unchanged(image_folder, tmp_path):
    streaming = pytest.importorskip("shardstream.streaming")
    manifest = build_shards(image_folder, tmp_path / "out", max_samples_per_shard=5)
    options = streaming.StreamOptions(output="dict")
    dataset = streaming.StreamingDataset(
        str(tmp_path / "out"), shuffle=False, decode="raw", options=options
    )
    assert len(dataset) == manifest.num_samples
    samples = list(dataset)
    originals = {
        str(p.relative_to(image_folder).with_suffix("")): p.read_bytes()
        for p in pathlib.Path(image_folder).rglob("*")
        if p.is_file()
    }
    # The reader names the image field "image" and the label "label", whatever the extension.
    assert {sample["__key__"]: sample["image"] for sample in samples} == originals
    for sample in samples:
        assert sample["label"] == int(sample["__key__"][len("class_") : len("class_") + 2])
