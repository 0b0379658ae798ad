"""The thread loader (``StreamingDataLoader(num_threads=N)``) against worker processes.

Each thread plays one DataLoader worker, so everything a loader promises must match
``num_workers=N``: the batches of every epoch in order, on every rank; the resume state (saved
with workers, resumed with threads, and back, also at another count); errors and skips; and a
stop on ``break`` or on an exception in the loop leaves no thread behind.
"""

from __future__ import annotations

import collections
import json
import pathlib
import threading
from typing import Any

import pytest
import torch
import torch.distributed as dist

from shardstream._format.tarreader import iter_samples, open_tar
from shardstream.errors import ConfigError, ShardFormatError
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from shardstream.streaming._worker.batch import ByteViews, WrappedViews
from tests.ddp import exit_rank_cleanly, spawn_ranks
from tests.streaming.conformance import assert_loader_resumes
from tests.streaming.shards import keys_of, make_dataset

#: 3 worker processes on a 2-core machine: torch's advice, not a problem of these tests.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
OPTIONS = StreamOptions(output="dict", num_open=3, piece_size=3, block_size=4)


def _batch_keys(batch: dict) -> tuple[str, ...]:
    return tuple(batch["__key__"])


def _epochs(loader: StreamingDataLoader, count: int = 2) -> list[list[tuple[str, ...]]]:
    return [[_batch_keys(batch) for batch in loader] for _ in range(count)]


def _dataset(root: pathlib.Path, **kwargs: Any) -> StreamingDataset:
    settings: dict[str, Any] = {"seed": 5, "batch_size": 3, "options": OPTIONS, **kwargs}
    return StreamingDataset(root, **settings)


def _worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("shardstream-worker-")]


@pytest.mark.slow
@pytest.mark.parametrize("count", [2, 3])
def test_threads_yield_the_batches_workers_yield(tmp_path: pathlib.Path, count: int) -> None:
    root, _ = make_dataset(tmp_path, 45, 7)
    threads = _epochs(StreamingDataLoader(_dataset(root), num_threads=count))
    workers = _epochs(StreamingDataLoader(_dataset(root), num_workers=count))
    assert threads == workers
    assert threads[0] != threads[1]  # passes move on to the next epoch by themselves
    assert len(threads[0]) == len(_dataset(root)) == 15


@pytest.mark.slow
def test_threads_decode_and_label_as_workers_do(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 20, 6)
    pairs = StreamOptions(num_open=3, piece_size=3, block_size=4)
    threaded = list(StreamingDataLoader(_dataset(root, options=pairs), num_threads=2))
    workers = list(StreamingDataLoader(_dataset(root, options=pairs), num_workers=2))
    assert len(threaded) == len(workers) == 7
    for (images, labels), (images_w, labels_w) in zip(threaded, workers, strict=True):
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 12, 16)
        assert labels.dtype == torch.int64
        assert torch.equal(images, images_w) and torch.equal(labels, labels_w)


def test_threaded_loader_resumes(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 45, 7)

    def make() -> StreamingDataLoader:
        return StreamingDataLoader(_dataset(root), num_threads=2)

    assert_loader_resumes(make, key=_batch_keys, num_points=3)


@pytest.mark.slow
@pytest.mark.parametrize(
    "saved,resumed",
    [
        ({"num_workers": 2}, {"num_threads": 2}),
        ({"num_threads": 2}, {"num_workers": 2}),
        ({"num_workers": 2}, {"num_threads": 3}),
        ({"num_threads": 3}, {"num_workers": 0}),
    ],
    ids=["workers-to-threads", "threads-to-workers", "2-workers-to-3-threads", "threads-to-loop"],
)
def test_a_state_moves_between_workers_and_threads(
    tmp_path: pathlib.Path, saved: dict, resumed: dict
) -> None:
    root, _ = make_dataset(tmp_path, 45, 7)
    whole = _epochs(StreamingDataLoader(_dataset(root), **saved))
    loader = StreamingDataLoader(_dataset(root), **saved)
    batches = iter(loader)
    head = [_batch_keys(next(batches)) for _ in range(7)]
    state = json.loads(json.dumps(loader.state_dict()))
    del batches
    assert head == whole[0][:7]
    restored = StreamingDataLoader(_dataset(root), **resumed)
    restored.load_state_dict(state)
    assert restored.position().epoch_batches == 7
    rest, following = _epochs(restored)
    assert [key for batch in head + rest for key in batch] != []
    assert collections.Counter(k for b in head + rest for k in b) == collections.Counter(
        k for b in whole[0] for k in b
    )  # the epoch holds the same samples, each as often, whatever reads its rest
    if resumed.get("num_threads", resumed.get("num_workers")) == 2:
        assert rest == whole[0][7:]  # the same layout: the very batches, in order
    assert following == _epochs(StreamingDataLoader(_dataset(root), **resumed), 2)[1]


def _break_shard(root: pathlib.Path, name: str, sample: int) -> None:
    """Make ``sample``'s first header declare 8 GiB (a parseable but impossible member)."""
    path = root / name
    data = bytearray(path.read_bytes())
    with open(path, "rb") as stream:
        offset = [o for _, o in iter_samples(open_tar(stream, str(path)))][sample]
    header = bytearray(data[offset : offset + 512])
    header[124:136] = b"77777777777\0"
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    data[offset : offset + 512] = header
    path.write_bytes(bytes(data))


@pytest.mark.slow
def test_a_broken_shard_raises_or_skips_as_with_workers(tmp_path: pathlib.Path) -> None:
    root, manifest = make_dataset(tmp_path, 40, 8)
    _break_shard(root, manifest.shards[1].name, 2)  # s000010
    options = StreamOptions(output="dict", shuffle_buffer=4, num_open=2, piece_size=4)
    skipping = {"batch_size": 8, "on_error": "skip", "options": options}
    threaded = list(StreamingDataLoader(_dataset(root, **skipping), num_threads=2))
    workers = list(StreamingDataLoader(_dataset(root, **skipping), num_workers=2))
    assert [_batch_keys(b) for b in threaded] == [_batch_keys(b) for b in workers]
    assert "s000010" not in keys_of(threaded) and len(threaded) == 5

    loader = StreamingDataLoader(_dataset(root, batch_size=8, options=options), num_threads=2)
    seen = []
    with pytest.raises(ShardFormatError, match=rf"{manifest.shards[1].name}.*declares"):
        for batch in loader:
            seen.append(_batch_keys(batch))
    reference = StreamingDataLoader(_dataset(root, batch_size=8, options=options), num_workers=2)
    before = []
    with pytest.raises(Exception, match="declares"):
        for batch in reference:
            before.append(_batch_keys(batch))
    assert seen == before  # raised at the same batch, after the same batches
    _wait_for_no_threads()


def _wait_for_no_threads() -> None:
    for thread in _worker_threads():
        thread.join(5.0)
    assert _worker_threads() == []


def _interrupted(loader: StreamingDataLoader) -> list[list[tuple[str, ...]]]:
    """A pass left by ``break`` after 2 batches, one left by an exception at its first, the
    rest of the epoch and the next one; checks that no worker thread outlives a pass."""

    class Stop(Exception):
        pass

    passes: list[list[tuple[str, ...]]] = [[], []]
    for batch in loader:
        passes[0].append(_batch_keys(batch))
        if loader.num_threads:
            assert len(_worker_threads()) == loader.num_threads
        if len(passes[0]) == 2:
            break
    _wait_for_no_threads()
    with pytest.raises(Stop):
        for batch in loader:
            passes[1].append(_batch_keys(batch))
            raise Stop
    _wait_for_no_threads()
    return passes + _epochs(loader, 2)


@pytest.mark.slow
def test_break_and_errors_in_the_loop_stop_the_threads(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 60, 7)
    threaded = _interrupted(
        StreamingDataLoader(_dataset(root, batch_size=2), num_threads=3, prefetch_factor=1)
    )
    workers = _interrupted(StreamingDataLoader(_dataset(root, batch_size=2), num_workers=3))
    assert threaded == workers
    assert sum(len(batches) for batches in threaded[:3]) == 30  # the epoch, in three passes


def test_raw_batches_are_views_of_the_shard_files(tmp_path: pathlib.Path) -> None:
    root, manifest = make_dataset(tmp_path, 14, 7)
    ds = StreamingDataset(root, batch_size=7, shuffle=False, decode="raw", options=OPTIONS)
    batch = next(iter(StreamingDataLoader(ds, num_threads=2)))
    images = batch["image"]
    # Views of the shard's bytes (kept to check before hand-out), not one buffer the bytes
    # were copied into.
    assert isinstance(images, WrappedViews) and not isinstance(images, ByteViews)
    shard = root / manifest.shards[0].name
    with open(shard, "rb") as stream:
        offsets = [offset for _, offset in iter_samples(open_tar(stream, str(shard)))]
    assert batch["__key__"] == [f"s{i:06d}" for i in range(7)]
    data = shard.read_bytes()
    first = bytes(images[0].numpy())
    base = images[0].data_ptr() - data.index(first, offsets[0])  # where the file would start
    for view, offset in zip(images, offsets, strict=True):
        # Each view sits where its bytes sit in the file: one mapping of the whole shard.
        start = view.data_ptr() - base
        assert offset < start < offset + 4096
        assert data[start : start + view.numel()] == bytes(view.numpy())


def test_threads_and_workers_are_refused_together(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 14, 7)
    with pytest.raises(ConfigError, match="threads or with worker processes"):
        StreamingDataLoader(_dataset(root), num_threads=2, num_workers=2)
    with pytest.raises(ConfigError, match="num_threads must be"):
        StreamingDataLoader(_dataset(root), num_threads=-1)


WORLD = 2


def _rank_epochs(rank: int, root: str, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        result = {}
        for mode in ({"num_threads": 2}, {"num_workers": 2}):
            ds = StreamingDataset(root, batch_size=2, options=StreamOptions(output="dict"))
            result[str(mode)] = _epochs(StreamingDataLoader(ds, **mode))
        pathlib.Path(out, f"{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    exit_rank_cleanly()


@pytest.mark.slow
def test_every_rank_reads_with_threads_what_it_reads_with_workers(tmp_path: pathlib.Path) -> None:
    root, manifest = make_dataset(tmp_path, 23, 5)
    store = str(tmp_path / "store")
    spawn_ranks(_rank_epochs, args=(str(root), store, str(tmp_path)), nprocs=WORLD, join=True)
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(WORLD)]
    for result in results:
        assert result["{'num_threads': 2}"] == result["{'num_workers': 2}"]
    for epoch in range(2):
        keys = [k for r in results for b in r["{'num_threads': 2}"][epoch] for k in b]
        assert set(keys) == {f"s{i:06d}" for i in range(manifest.num_samples)}


@pytest.mark.slow
def test_a_mixture_reads_with_threads_what_it_reads_with_workers(tmp_path: pathlib.Path) -> None:
    from shardstream import Stream, build_shards
    from tests.streaming.shards import make_samples

    sources = []
    for prefix, count in (("a", 50), ("b", 12)):
        samples = [{**s, "__key__": prefix + s["__key__"]} for s in make_samples(count)]
        build_shards(samples, tmp_path / prefix, max_samples_per_shard=6)
        sources.append(str(tmp_path / prefix))

    def loader(**mode: int) -> StreamingDataLoader:
        streams = [Stream(sources[0], proportion=3), Stream(sources[1], proportion=1)]
        ds = StreamingDataset(streams, seed=2, batch_size=2, epoch_size=40, options=OPTIONS)
        return StreamingDataLoader(ds, **mode)

    threaded = _epochs(loader(num_threads=3), 3)
    assert threaded == _epochs(loader(num_workers=3), 3)
    assert len({tuple(epoch) for epoch in threaded}) == 3


@pytest.mark.slow
def test_a_state_of_another_world_size_resumes_with_threads(tmp_path: pathlib.Path) -> None:
    root, manifest = make_dataset(tmp_path, 45, 7)

    def loader(rank: int, world: int, **mode: int) -> StreamingDataLoader:
        options = StreamOptions(
            output="dict", num_open=3, piece_size=3, block_size=4, rank=rank, world_size=world
        )
        return StreamingDataLoader(_dataset(root, options=options, batch_size=2), **mode)

    states, seen = [], []
    for rank in range(3):  # 3 ranks read 4 batches each, with workers
        old = loader(rank, 3, num_workers=2)
        batches = iter(old)
        seen += [key for _ in range(4) for key in _batch_keys(next(batches))]
        states.append(json.loads(json.dumps(old.state_dict())))
        del batches
    rest = {"num_threads": [], "num_workers": []}  # type: dict[str, list[str]]
    for mode in rest:
        for rank in range(2):  # 2 ranks read the rest of the epoch
            new = loader(rank, 2, **{mode: 3})
            new.load_state_dict(states[0])
            rest[mode] += [key for batch in new for key in _batch_keys(batch)]
    assert rest["num_threads"] == rest["num_workers"]
    assert set(seen) | set(rest["num_threads"]) == {
        f"s{i:06d}" for i in range(manifest.num_samples)
    }


def test_statistics_have_a_row_per_thread(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 60, 7)
    ds = StreamingDataset(root, batch_size=4, options=StreamOptions(stats=True))
    loader = StreamingDataLoader(ds, num_threads=2)
    assert sum(len(labels) for _, labels in loader) == 60
    workers = loader.stats()["passes"][-1]["workers"]
    assert [row["worker"] for row in workers] == [0, 1]
    assert sum(row["samples"] for row in workers) == 60
    assert [row["batches"] for row in workers] == [8, 7]  # each thread's turns, counted once


@pytest.mark.slow
def test_the_interpreter_exits_cleanly_with_threads_mid_epoch(tmp_path: pathlib.Path) -> None:
    """A script that stops iterating mid-epoch and ends: the loader's threads, still inside
    torch calls, are stopped before the interpreter exits (it used to abort the process:
    'terminate called without an active exception', exit status -6)."""
    import subprocess
    import sys

    from tests.conftest import write_image_folder

    write_image_folder(tmp_path / "images", num_classes=2, per_class=24, size=(40, 32))
    from shardstream import build_shards

    build_shards(tmp_path / "images", tmp_path / "ds", max_samples_per_shard=8)
    code = f"""
from torchvision.transforms import v2
from shardstream import StreamingDataLoader, StreamingDataset
t = v2.Compose([v2.RandomResizedCrop(16, antialias=True)])
ds = StreamingDataset({str(tmp_path / "ds")!r}, batch_size=4, transform=t)
batches = iter(StreamingDataLoader(ds, num_threads=2))
next(batches)
print("left mid-epoch")
"""
    for _ in range(4):  # the abort needed a thread inside a torch call at exit: try a few times
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert "left mid-epoch" in result.stdout and "Traceback" not in result.stderr
