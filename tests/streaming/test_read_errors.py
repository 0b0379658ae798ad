"""Errors a user causes on the read side reach the training process as one clear message; a
manifest that under-counts a shard is logged, not read silently; a loop left early ends quietly.
"""

from __future__ import annotations

import functools
import http.server
import json
import logging
import pathlib
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from shardstream._cli import main as cli_main
from shardstream._format.manifest import read_manifest
from shardstream._format.verify import find_problems
from shardstream._storage import Store
from shardstream.errors import ShardNotFoundError
from shardstream.shardwriter import build_shards
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from tests.streaming.shards import make_samples


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def http_folder(tmp_path: pathlib.Path) -> Iterator[tuple[pathlib.Path, str]]:
    """A folder served over HTTP on 127.0.0.1 (a missing file is a 404), and its URL."""
    folder = tmp_path / "served"
    folder.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield folder, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_404_in_a_url_list_reaches_the_training_process_as_one_message(
    http_folder: tuple[pathlib.Path, str], tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    folder, url = http_folder
    build_shards(make_samples(8), folder / "data", max_samples_per_shard=4)
    listing = tmp_path / "train.txt"
    listing.write_text(f"{url}/data/shard-000000.tar\n{url}/data/shard-000007.tar\n")
    loader = StreamingDataLoader(StreamingDataset(listing, decode="raw"), num_workers=2)
    with pytest.raises(ShardNotFoundError) as caught:
        list(loader)
    message = str(caught.value)
    assert message.startswith(f"{url}/data/shard-000007.tar: shard not found; check")
    assert "on_error='skip'" in message and "in DataLoader worker process" in message
    assert "Traceback" not in message and "\n" not in message
    assert "pipeline.py" in (caught.value.worker_traceback or "")  # kept for a bug report
    skipping = StreamingDataset(listing, decode="raw", on_error="skip")
    assert len(list(StreamingDataLoader(skipping, num_workers=2))) == 4  # the other shard
    assert cli_main(["bench", str(listing), "--workers", "0", "--mode", "raw", "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {url}/data/shard-000007.tar: shard not found") and err.count(
        "\n") == 1 and "--on-error skip" in err, err  # fmt: skip


def _under_counted(tmp_path: pathlib.Path) -> pathlib.Path:
    """A dataset of 3 shards of 10 whose manifest says the first holds 7."""
    root = tmp_path / "data"
    build_shards(make_samples(30), root, max_samples_per_shard=10)
    document = json.loads((root / "manifest.json").read_text())
    document["shards"][0]["num_samples"] = 7
    document["num_samples"] = 27
    (root / "manifest.json").write_text(json.dumps(document))
    return root


def test_a_manifest_that_under_counts_a_shard_is_logged_once_per_process(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = _under_counted(tmp_path)
    dataset = StreamingDataset(root, decode="raw", batch_size=1,
                               options=StreamOptions(output="dict"))  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        epochs = [_epoch(dataset, epoch) for epoch in (0, 1)]
    assert [len(keys) for keys in epochs] == [27, 27]  # exact epochs follow the manifest
    said = [r.getMessage() for r in caplog.records if "shard-000000.idx" in r.getMessage()]
    assert len(said) == 1, said  # once per shard per process, not per piece or epoch
    assert "index lists 10 samples, the manifest 7" in said[0]
    problems = find_problems(Store(str(root)), read_manifest(str(root)))
    assert problems == ["shard-000000.tar: samples expected 7, found 10"]


@pytest.mark.slow
def test_under_counted_shards_are_logged_by_each_worker_once(tmp_path: pathlib.Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _READ_IN_WORKERS, str(_under_counted(tmp_path)), "2"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0 and result.stdout.strip() == "27", result.stderr
    said = [line for line in result.stderr.splitlines() if "shard-000000.idx" in line]
    assert 1 <= len(said) <= 2, result.stderr  # a worker that reads the shard says it once
    assert all("index lists 10 samples, the manifest 7" in line for line in said)


def _epoch(dataset: StreamingDataset, epoch: int) -> list[str]:
    dataset.set_epoch(epoch)
    return [key for batch in StreamingDataLoader(dataset) for key in batch["__key__"]]


_READ_IN_WORKERS = """
import sys
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
ds = StreamingDataset(sys.argv[1], decode="raw", batch_size=1, options=StreamOptions(output="dict"))
keys = [k for b in StreamingDataLoader(ds, num_workers=int(sys.argv[2])) for k in b["__key__"]]
print(len(keys))
"""


_LEAVE_EARLY = """
import itertools, sys
from shardstream.streaming import StreamingDataLoader, StreamingDataset
dataset = StreamingDataset(sys.argv[1], decode="raw", shuffle=True)
iterator = iter(dataset)
first = list(itertools.islice(iterator, 50))
batches = iter(StreamingDataLoader(StreamingDataset(sys.argv[1], batch_size=4), num_workers=0))
next(batches)
print(len(first))
"""


@pytest.mark.slow
def test_a_pass_left_unfinished_ends_quietly_at_exit(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "data"
    build_shards(make_samples(120), root, max_samples_per_shard=30)
    result = subprocess.run(
        [sys.executable, "-X", "dev", "-c", _LEAVE_EARLY, str(root)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0 and result.stdout.strip() == "50", result.stderr
    assert result.stderr == "", result.stderr  # no "Exception ignored in: <generator ...>"
