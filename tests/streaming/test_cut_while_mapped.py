"""A shard file cut while the loader reads it through memory maps: a clear error, never SIGBUS.

Local shards are read through memory maps, and touching a mapped byte that its file no longer
holds kills the process with SIGBUS: the training process itself without workers or with
threads. Each case runs in a child process (so this one survives what happens there), reads one
batch, cuts shard files in place (what a build or copy into the same file does), then keeps
reading and touching every byte of every batch, as a training loop does.

The cut comes while the readers wait with their batches made ahead: a cut in the microseconds
between a reader's check of a file and its touch of the bytes can still kill it (documented),
which a test cannot make happen on purpose. A worker process killed by SIGBUS is the last case.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
import zlib

import pytest

from shardstream._storage import Store
from shardstream._storage.backends.localmaps import LocalRanges, WindowMaps, lost_bytes, still_holds
from shardstream.shardwriter import build_shards
from shardstream.streaming._decoding.encoded import EncodedBatch
from shardstream.streaming._worker.batch import lost_in, pack_bytes
from tests.streaming.shards import make_samples, sample_offsets, tiny_jpeg

NUM_SAMPLES = 800

_READ = """
import json, os, sys, time, zlib
from shardstream import StreamingDataLoader, StreamingDataset, StreamOptions
root, loader, on_error, cut = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
ds = StreamingDataset(root, decode="raw", batch_size=16, on_error=on_error, seed=1,
                      options=StreamOptions(output="dict"))
workers = {"threads": {"num_threads": 2}, "workers": {"num_workers": 2}}.get(loader, {})
delivered = {}
for number, batch in enumerate(StreamingDataLoader(ds, **workers)):
    for key, image in zip(batch["__key__"], batch["image"], strict=True):
        delivered[key] = zlib.crc32(image.numpy().tobytes())  # touches every byte
    if number == 0:
        time.sleep(1.5)  # the readers make their batches ahead, then wait
        for name, size in cut.items():  # in place, as a build or a copy into the file does
            os.truncate(os.path.join(root, name), size)
print(json.dumps(delivered))
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("cut") / "data"
    build_shards(make_samples(NUM_SAMPLES), root, max_samples_per_shard=200)
    return root


def _read(
    dataset: pathlib.Path, tmp_path: pathlib.Path, loader: str, on_error: str, fraction: float
) -> subprocess.CompletedProcess[str]:
    """Read a copy of ``dataset`` in a child, the shards named cut to ``fraction`` of their
    size after the first batch (the first shard alone when skipping)."""
    root = tmp_path / "data"
    root.mkdir()
    for path in dataset.iterdir():
        (root / path.name).write_bytes(path.read_bytes())
    shards = sorted(path for path in root.iterdir() if path.suffix == ".tar")
    cut = {path.name: int(path.stat().st_size * fraction) for path in shards}
    if on_error == "skip":
        cut = dict(list(cut.items())[:1])
    return subprocess.run(
        [sys.executable, "-c", _READ, str(root), loader, on_error, json.dumps(cut)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_views_of_bytes_a_cut_file_lost_are_found_before_they_are_touched(
    dataset: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """In this process: nothing here touches a lost byte."""
    path = tmp_path / "shard-000000.tar"
    path.write_bytes((dataset / path.name).read_bytes())
    offsets = sample_offsets(path)
    ranges = LocalRanges(Store(str(tmp_path)))
    early = ranges.view(path.name, offsets[1], offsets[2])
    late = ranges.view(path.name, offsets[150], offsets[151])
    with open(path, "rb") as stream:
        windows = WindowMaps(stream, offsets, 200)
        assert windows.view(120) is not None
        path.write_bytes(b"")  # cut in place: a build or copy writing into the same file
        path.write_bytes((dataset / path.name).read_bytes()[: offsets[100]])
        assert windows.view(121) is None  # read instead: the reader reports what is missing
    assert early is not None and late is not None
    assert lost_bytes([b"x", 3, early]) is None and still_holds(early, offsets[2])
    assert not still_holds(late, offsets[151])
    message = lost_bytes([early, late])
    assert message is not None and message.startswith(
        f"{path}: the file is now {offsets[100]:,} bytes, but a sample read from its memory map "
        f"needs bytes {offsets[150]:,}..{offsets[150] + late.nbytes:,}"
    )
    assert ranges.view(path.name, offsets[150], offsets[151]) is None  # read, and reported
    assert ranges.view(path.name, offsets[1], offsets[2]) is not None  # still there
    # Raw batches made without a copy (threads) keep the views they wrap, checked at hand-out.
    images = pack_bytes([early, late])
    encoded = EncodedBatch(images, None, [], [], None)
    for batch in ({"image": images, "label": 0}, (images, None), images, (encoded, None)):
        assert lost_in(batch) == message
    assert lost_in({"image": pack_bytes([early])}) is None
    ranges.close()


LOADERS = ["no workers", "threads", "workers"]


def _raised(stderr: str) -> str:
    """The last exception line of a child's stderr (a dying DataLoader worker writes after)."""
    return [line for line in stderr.splitlines() if re.match(r"[\w.]+Error: ", line)][-1]


@pytest.mark.parametrize("loader", LOADERS)
def test_a_shard_cut_while_mapped_raises_a_clear_error(
    dataset: pathlib.Path, tmp_path: pathlib.Path, loader: str
) -> None:
    result = _read(dataset, tmp_path, loader, "raise", 0.25)
    assert result.returncode == 1, (result.returncode, result.stderr[-3000:])  # not SIGBUS
    last = _raised(result.stderr)
    assert last.startswith("shardstream.errors.ShardFormatError: "), result.stderr[-3000:]
    # Names the file, its size now and the bytes it lacks, and what to do.
    assert re.search(r"/shard-00000\d\.tar: the (file is now|shard is) [\d,]+ bytes", last), last
    assert "verify" in last
    assert "Bus error" not in result.stderr


@pytest.mark.parametrize("loader", LOADERS)
def test_skipping_counts_what_a_shard_cut_while_mapped_lost(
    dataset: pathlib.Path, tmp_path: pathlib.Path, loader: str
) -> None:
    result = _read(dataset, tmp_path, loader, "skip", 0.5)
    assert "Bus error" not in result.stderr
    if result.returncode != 0:
        # Threads hand out views of the shard's map: a batch made before the cut and handed
        # out after it cannot skip (its samples were counted as read), so it raises.
        assert loader == "threads", result.stderr[-3000:]
        last = _raised(result.stderr)
        assert "shard-000000.tar: the file is now" in last, last
        return
    delivered = json.loads(result.stdout)
    expected = {f"s{i:06d}": zlib.crc32(tiny_jpeg(i % 16)) for i in range(NUM_SAMPLES)}
    assert {key: expected[key] for key in delivered} == delivered  # every byte as written
    skipped = [int(n) for n in re.findall(r"worker skipped (\d+) sample", result.stderr)]
    assert skipped and len(delivered) + sum(skipped) == NUM_SAMPLES, result.stderr[-3000:]
    assert "shard-000000.tar" in result.stderr


_KILLED = """
import os, signal, sys
from shardstream import StreamingDataLoader, StreamingDataset

def die(image):  # what touching a memory-mapped byte its file lost does to a worker
    os.kill(os.getpid(), signal.SIGBUS)

ds = StreamingDataset(sys.argv[1], batch_size=16, transform=die)
os.truncate(os.path.join(sys.argv[1], "shard-000002.tar"), int(sys.argv[2]))
next(iter(StreamingDataLoader(ds, num_workers=2)))
"""


@pytest.mark.parametrize("cut", [True, False])
def test_a_worker_killed_by_sigbus_names_the_shards_cut(
    dataset: pathlib.Path, tmp_path: pathlib.Path, cut: bool
) -> None:
    """torch says "killed by signal: Bus error" and blames shared memory; the loader names
    the shard files now shorter than their manifest says, when there are such files (here the
    end-of-archive blocks are cut, so no sample is missing and the worker dies first)."""
    root = tmp_path / "data"
    root.mkdir()
    for path in dataset.iterdir():
        (root / path.name).write_bytes(path.read_bytes())
    size = (root / "shard-000002.tar").stat().st_size
    result = subprocess.run(
        [sys.executable, "-c", _KILLED, str(root), str(size - 512 if cut else size)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    last = _raised(result.stderr)
    if cut:
        assert last.startswith("shardstream.errors.ShardFormatError: a DataLoader worker was "
                               "killed by a bus error (SIGBUS)"), last  # fmt: skip
        assert f"{root / 'shard-000002.tar'}." in last and "shard-000001" not in last
        assert "memory_map=False" in last
    else:  # nothing cut: torch's own error stands
        assert last.startswith("RuntimeError: DataLoader worker"), last
