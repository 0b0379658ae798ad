"""Mixtures of datasets: exact per-stream counts per epoch, equal ranks, coverage, resume."""

from __future__ import annotations

import collections
import pathlib

import pytest

from shardstream import Stream, StreamingDataLoader, StreamingDataset, StreamOptions, build_shards
from shardstream.errors import ConfigError
from shardstream.streaming._options import stream_quotas
from tests.streaming.conformance import assert_loader_resumes
from tests.streaming.shards import keys_of, make_samples

OPTIONS = {"output": "dict", "shuffle_buffer": 8, "num_open": 4, "piece_size": 4}


def _build(root: pathlib.Path, prefix: str, count: int, per_shard: int) -> str:
    samples = [{**s, "__key__": prefix + s["__key__"]} for s in make_samples(count)]
    build_shards(samples, root / prefix, max_samples_per_shard=per_shard)
    return str(root / prefix)


@pytest.fixture
def sources(tmp_path: pathlib.Path) -> dict[str, str]:
    return {"a": _build(tmp_path, "a", 50, 8), "b": _build(tmp_path, "b", 12, 5)}


def _rank_keys(streams, world: int, workers: int, epoch: int, **kwargs) -> list[list[str]]:  # type: ignore[no-untyped-def]
    keys = []
    for rank in range(world):
        options = StreamOptions(**OPTIONS, rank=rank, world_size=world)
        dataset = StreamingDataset(streams, seed=2, options=options, batch_size=2, **kwargs)
        dataset.set_epoch(epoch)
        keys.append(keys_of(StreamingDataLoader(dataset, num_workers=workers)))
    return keys


@pytest.mark.slow
@pytest.mark.parametrize(
    "shares,epoch_size,world,workers",
    [((0.7, 0.3), 40, 2, 0), ((0.5, 0.5), 36, 3, 2), ((0.9, 0.1), 20, 1, 2)],
)
def test_every_epoch_takes_exact_counts_per_stream_and_ranks_are_equal(
    sources: dict[str, str], shares: tuple, epoch_size: int, world: int, workers: int
) -> None:
    streams = [Stream(sources[name], proportion=p) for name, p in zip("ab", shares, strict=True)]
    quotas = stream_quotas([50, 12], list(shares), [None, None], epoch_size)
    for epoch in range(2):
        per_rank = _rank_keys(streams, world, workers, epoch, epoch_size=epoch_size)
        assert len({len(keys) for keys in per_rank}) == 1, "ranks got different counts"
        counts = collections.Counter(key[0] for keys in per_rank for key in keys)
        assert [counts["a"], counts["b"]] == quotas


@pytest.mark.slow
def test_streams_cover_every_sample_before_repeating(sources: dict[str, str]) -> None:
    streams = [Stream(sources["a"], repeat=0.5), Stream(sources["b"], repeat=2.0)]
    epochs = [_rank_keys(streams, 1, 0, epoch)[0] for epoch in range(3)]
    for keys in epochs:
        counts = collections.Counter(keys)
        assert sum(1 for k in keys if k[0] == "a") == 25  # half of a
        assert {k: n for k, n in counts.items() if k[0] == "b"} == {
            f"bs{i:06d}": 2 for i in range(12)
        }  # b twice, whole passes
    a_seen = [k for keys in epochs[:2] for k in keys if k[0] == "a"]
    assert sorted(a_seen) == [f"as{i:06d}" for i in range(50)]  # all of a before any repeat


def test_samples_say_their_stream_and_the_summary_counts(sources: dict[str, str]) -> None:
    streams = [Stream(sources["a"], proportion=3, name="web"), Stream(sources["b"], proportion=1)]
    dataset = StreamingDataset(streams, epoch_size=8, options=StreamOptions(**OPTIONS))
    samples = list(dataset)
    assert all(s["__stream__"] == (0 if s["__key__"][0] == "a" else 1) for s in samples)
    summary = dataset.mixture.summary()  # type: ignore[union-attr]
    assert [row["samples_per_epoch"] for row in summary] == [6, 2] and summary[0]["name"] == "web"
    assert summary[1]["num_samples"] == 12 and len(dataset) == 8


def test_bad_mixtures_are_refused(sources: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="need epoch_size"):
        StreamingDataset([Stream(sources["a"], proportion=1)])
    with pytest.raises(ConfigError, match="every stream needs one"):
        StreamingDataset([Stream(sources["a"], proportion=1), Stream(sources["b"])], epoch_size=4)
    with pytest.raises(ConfigError, match="either proportion or repeat"):
        StreamingDataset([Stream(sources["a"], proportion=1, repeat=2)], epoch_size=4)
    with pytest.raises(ConfigError, match="Stream"):
        StreamingDataset([Stream(sources["a"]), sources["b"]])  # type: ignore[list-item]


@pytest.mark.slow
def test_mixed_epochs_resume_exactly(sources: dict[str, str]) -> None:
    streams = [Stream(sources["a"], proportion=0.6), Stream(sources["b"], proportion=0.4)]

    def make() -> StreamingDataLoader:
        dataset = StreamingDataset(
            streams, epoch_size=30, batch_size=3, seed=4, options=StreamOptions(**OPTIONS)
        )
        return StreamingDataLoader(dataset, num_workers=2)

    assert_loader_resumes(make, key=lambda batch: tuple(batch["__key__"]))


@pytest.mark.slow
def test_elastic_resume_inside_a_mixed_epoch_keeps_the_counts(sources: dict[str, str]) -> None:
    streams = [
        Stream(sources["a"], proportion=0.5),
        Stream(sources["b"], repeat=None, proportion=0.5),
    ]

    def loaders(world: int) -> list[StreamingDataLoader]:
        result = []
        for rank in range(world):
            options = StreamOptions(**OPTIONS, rank=rank, world_size=world)
            dataset = StreamingDataset(
                streams, epoch_size=48, batch_size=2, policy="drop", options=options
            )
            result.append(StreamingDataLoader(dataset))
        return result

    old = loaders(2)
    iterators = [iter(loader) for loader in old]
    head = [k for _ in range(5) for it in iterators for k in next(it)["__key__"]]
    state = old[0].state_dict()
    new = loaders(4)  # 28 samples left: 7 per rank, so no sample is padded or dropped
    rest = []
    for loader in new:
        loader.load_state_dict(state)
        rest.append(keys_of(loader))
    assert len({len(keys) for keys in rest}) == 1
    counts = collections.Counter(key[0] for key in head + [k for keys in rest for k in keys])
    assert [counts["a"], counts["b"]] == [24, 24]  # 24 of each, as the uninterrupted epoch


def test_samples_name_their_own_datasets_shard(sources: dict[str, str]) -> None:
    """Both datasets have a shard-000000.tar: each sample's ``__url__`` is its own dataset's."""
    streams = [Stream(sources["a"], proportion=0.5), Stream(sources["b"], proportion=0.5)]
    dataset = StreamingDataset(streams, epoch_size=20, options=StreamOptions(**OPTIONS))
    samples = list(dataset)
    assert len(samples) == 20
    for sample in samples:
        folder = sources["a" if sample["__stream__"] == 0 else "b"]
        assert sample["__url__"].startswith(folder + "/"), (sample["__key__"], sample["__url__"])
