"""StreamingDataset end to end: manifests, patterns, workers, ranks, errors, round trips."""

from __future__ import annotations

import collections
import pathlib

import pytest
import torch
from torch.utils.data import DataLoader

from shardstream.errors import ManifestNotFoundError, ShardFormatError
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from tests.streaming.shards import keys_of, make_dataset, tiny_jpeg

DICT = StreamOptions(output="dict")


def test_single_process_epoch_and_len(tmp_path: pathlib.Path) -> None:
    root, _manifest = make_dataset(tmp_path, 40, 7)
    ds = StreamingDataset(root, batch_size=4, options=DICT)
    assert len(ds) == 10
    batches = list(ds)
    assert len(batches) == 10 and batches[0]["image"].shape == (4, 3, 12, 16)
    assert sorted(keys_of(batches)) == [f"s{i:06d}" for i in range(40)]
    assert batches[0]["json"][0].keys() == {"index"}
    images, labels = next(iter(StreamingDataset(root, batch_size=4)))
    assert labels.dtype == torch.int64 and images.dtype == torch.uint8


def test_epochs_are_seeded(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 40, 7)
    ds = StreamingDataset(root, options=DICT, seed=1)
    first = keys_of(ds)
    second = keys_of(ds)  # a new pass reads the next epoch by itself
    assert second != first and sorted(second) == sorted(first)
    assert keys_of(StreamingDataset(root, options=DICT, seed=1)) == first  # seeded
    ds.set_epoch(1)
    assert keys_of(ds) == second
    ds.set_epoch(0)
    assert keys_of(ds) == first and keys_of(ds) == second  # pinned, then counting on
    ordered = keys_of(StreamingDataset(root, options=DICT, shuffle=False))
    assert ordered == sorted(ordered)


def test_dataloader_workers_cover_the_epoch(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 40, 7)
    ds = StreamingDataset(root, batch_size=3, options=DICT)
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    batches = list(loader)
    assert len(batches) == len(ds)
    assert sorted(keys_of(batches)) == [f"s{i:06d}" for i in range(40)]


@pytest.mark.parametrize("policy", ["pad", "drop"])
def test_ranks_by_argument_are_equal_and_cover(tmp_path: pathlib.Path, policy: str) -> None:
    root, _ = make_dataset(tmp_path, 10, 7)  # 2 shards for 3 ranks x 2 workers
    seen: collections.Counter[str] = collections.Counter()
    sizes = set()
    for rank in range(3):
        options = StreamOptions(output="dict", rank=rank, world_size=3)
        ds = StreamingDataset(root, batch_size=2, policy=policy, options=options)
        batches = list(DataLoader(ds, batch_size=None, num_workers=2))
        sizes.add((len(batches), len(ds)))
        seen.update(keys_of(batches))
    assert len(sizes) == 1 and next(iter(sizes))[0] == next(iter(sizes))[1]
    if policy == "pad":
        assert len(seen) == 10 and sum(seen.values()) == 12
    else:
        assert max(seen.values()) == 1 and len(seen) == 9


def test_patterns_without_manifest_have_no_len(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 20, 7)
    ds = StreamingDataset(str(root / "shard-{000000..000002}.tar"), options=DICT)
    with pytest.raises(TypeError, match="no manifest"):
        len(ds)
    assert sorted(keys_of(ds)) == [f"s{i:06d}" for i in range(20)]
    with pytest.raises(ManifestNotFoundError):
        StreamingDataset(tmp_path)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # webdataset's files
def test_webdataset_shards_stream_and_ours_read_by_webdataset(tmp_path: pathlib.Path) -> None:
    import webdataset as wds

    for shard in range(2):
        with wds.TarWriter(str(tmp_path / f"w-{shard}.tar")) as sink:
            for index in range(5):
                sink.write({"__key__": f"d/{shard}-{index}", "jpg": tiny_jpeg(index), "cls": shard})
    ds = StreamingDataset(str(tmp_path / "w-{0..1}.tar"), batch_size=5)
    labels = sorted(int(x) for _, y in ds for x in y)
    assert labels == [0] * 5 + [1] * 5
    root, _ = make_dataset(tmp_path, 12, 5)
    pipeline = wds.WebDataset(str(root / "shard-{000000..000002}.tar"), shardshuffle=False)
    ours = sorted(keys_of(StreamingDataset(root, options=DICT)))
    assert sorted(s["__key__"] for s in pipeline) == ours


def test_on_error_skip_counts_and_keeps_batch_count(tmp_path: pathlib.Path, caplog) -> None:  # type: ignore[no-untyped-def]
    root, _ = make_dataset(tmp_path, 14, 7)
    shard = root / "shard-000001.tar"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(ShardFormatError, match=r"shard-000001\.tar"):
        list(StreamingDataset(root, batch_size=2))
    # Seed 4 puts no batch wholly on broken samples (such a batch cannot be collated: it raises).
    ds = StreamingDataset(root, batch_size=2, on_error="skip", seed=4, options=DICT)
    batches = list(ds)
    assert len(batches) == len(ds) == 7
    assert 7 <= len(keys_of(batches)) < 14
    assert "skipped" in caplog.text


def test_loader_refuses_double_batching(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 10, 7)
    with pytest.raises(ValueError, match="batch_size"):
        StreamingDataLoader(StreamingDataset(root, batch_size=2), batch_size=4)


def test_raw_fields_are_bytes_whatever_the_reader_holds(tmp_path: pathlib.Path) -> None:
    from shardstream.shardwriter import build_shards

    samples = [{"__key__": f"k{i}", "jpg": tiny_jpeg(i), "bin": bytes([i]) * 9} for i in range(6)]
    build_shards(samples, tmp_path / "ds", max_samples_per_shard=3)
    for item in StreamingDataset(tmp_path / "ds", decode="raw", options=DICT):
        assert type(item["image"]) is bytes and type(item["bin"]) is bytes
        assert item["bin"] == bytes([int(item["__key__"][1:])]) * 9
    batch = next(iter(StreamingDataset(tmp_path / "ds", decode="raw", batch_size=3, options=DICT)))
    assert all(type(value) is bytes for value in batch["bin"])
    assert [bytes(view.numpy()) for view in batch["image"]] == [
        tiny_jpeg(int(key[1:])) for key in batch["__key__"]
    ]


def _freeze_count(_image: object) -> int:
    import gc

    return gc.get_freeze_count()


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_put_what_they_inherit_out_of_the_collectors_reach(
    tmp_path: pathlib.Path, persistent: bool
) -> None:
    """A forked worker's first full collection would copy the parent's heap: workers freeze
    what they hold at their first pass; the training process itself is left alone."""
    import gc

    root, _ = make_dataset(tmp_path, num_samples=24)
    ds = StreamingDataset(root, decode="raw", transform=_freeze_count, batch_size=4)
    before = gc.get_freeze_count()
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=persistent)
    for _ in range(2):
        counts = [int(count) for images, _ in loader for count in images]
        assert len(counts) == 24 and all(count > 0 for count in counts)
    assert list(DataLoader(ds, batch_size=None, num_workers=0))  # no workers: not frozen
    assert gc.get_freeze_count() == before


def test_indexing_a_stream_points_to_random_access(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 6, 3)
    with pytest.raises(TypeError, match=r"has no ds\[0\].*RandomAccessDataset\(source\)"):
        StreamingDataset(root)[0]
    assert len(list(StreamingDataLoader(StreamingDataset(root, batch_size=2), num_workers=2))) == 3


def test_a_gzipped_label_member_is_the_label_as_webdataset_reads_it(
    tmp_path: pathlib.Path,
) -> None:
    import gzip
    import io
    import tarfile

    with tarfile.open(tmp_path / "a.tar", "w") as tar:
        for i in range(4):
            for name, data in ((f"k{i}.jpg", tiny_jpeg(i)),
                               (f"k{i}.cls.gz", gzip.compress(str(i % 3).encode()))):  # fmt: skip
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    pairs = StreamingDataset(str(tmp_path / "a.tar"), shuffle=False, decode="raw")
    assert [label for _, label in pairs] == [0, 1, 2, 0]  # was -1: "cls.gz" not a label
