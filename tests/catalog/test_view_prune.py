"""Views against `prune`: prune names the views whose files it removes, and a view whose files
are gone fails at once with one message, not with a FileNotFoundError in a DataLoader worker."""

from __future__ import annotations

import pathlib

import pyarrow as pa
import pytest

from shardstream import (
    ManifestError,
    StreamingDataLoader,
    StreamingDataset,
    StreamOptions,
    build_shards,
    make_view,
)
from shardstream._catalog.attach import attach_columns
from shardstream._catalog.exclude import exclude_samples
from shardstream._cli import main
from shardstream.shardwriter._compact import compact_dataset
from tests.streaming.shards import make_samples


def _keys(root: pathlib.Path, workers: int = 2) -> list[str]:
    dataset = StreamingDataset(root, batch_size=3, decode="raw",
                               options=StreamOptions(output="dict"))  # fmt: skip
    return [key for batch in StreamingDataLoader(dataset, num_workers=workers)
            for key in batch["__key__"]]  # fmt: skip


def _views(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    root = tmp_path / "ds"
    build_shards(make_samples(20), root, max_samples_per_shard=8)
    attach_columns(root, pa.table({"__key__": [f"s{i:06d}" for i in range(20)],
                                   "aesthetic": [i % 5 for i in range(20)]}))  # fmt: skip
    make_view(root, tmp_path / "pretty", where="aesthetic >= 2")
    make_view(root, tmp_path / "half", fraction=0.5)
    return root, tmp_path / "pretty", tmp_path / "half"


def test_prune_names_the_views_it_would_break_and_they_then_fail_at_open(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, pretty, half = _views(tmp_path)
    assert len(_keys(pretty)) == 12 and len(_keys(half)) == 10
    exclude_samples(root, ["s000003", "s000004"])
    compact_dataset(root)  # rewrites shard 0 under another name
    assert main(["prune", str(root), "--keep", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    for view in (pretty, half):
        assert f"view {view} (made of version 2) will no longer be read" in out, out
    assert "it reads shard-000000.tar" in out
    assert len(_keys(pretty)) == 12  # a dry run removes nothing
    assert main(["prune", str(root), "--keep", "1"]) == 0
    assert f"view {pretty} (made of version 2) can no longer be read" in capsys.readouterr().out
    for view in (pretty, half):
        with pytest.raises(ManifestError) as caught:
            StreamingDataset(view, decode="raw")  # at open, in this process
        message = str(caught.value)
        assert f"{view}: this view was made of version 2 of" in message, message
        assert "shard-000000.tar" in message and "make the view again" in message
    assert main(["inspect", str(root)]) == 0 and capsys.readouterr().err == ""
    assert main(["bench", str(pretty), "--workers", "2", "--mode", "raw", "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {pretty}: this view was made of version 2") and err.count(
        "\n") == 1, err  # fmt: skip
    make_view(root, tmp_path / "again", where="aesthetic >= 2")  # made again: reads
    assert len(_keys(tmp_path / "again")) == 10  # s000003 and s000004 were excluded


def test_a_view_of_a_pruned_version_whose_files_stay_still_reads(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ds"
    build_shards(make_samples(20), root, max_samples_per_shard=8)
    make_view(root, tmp_path / "half", fraction=0.5)  # of version 1, without fields
    attach_columns(root, pa.table({"__key__": ["s000001"], "other": [1]}))  # version 2
    assert main(["prune", str(root), "--keep", "1"]) == 0  # removes version 1
    assert "no longer be read" not in capsys.readouterr().out
    assert not (root / "manifest.v000001.json").exists()
    assert len(_keys(tmp_path / "half")) == 10  # its shards and indexes are version 2's too
