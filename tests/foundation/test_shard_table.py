"""Large manifests: the binary shard table (format 2), read by reference and checked like JSON."""

from __future__ import annotations

import io
import json
import pathlib

import numpy as np
import pytest

from shardstream import ManifestError
from shardstream._format import manifest as manifest_module
from shardstream._format.manifest import Manifest, ShardInfo, read_manifest, write_manifest
from shardstream._format.shardtable import NameColumn, ShardTable, decode_table, encode_table


def _shards(count: int, names: str = "shard-{:06d}.tar", sha: bool = True) -> list[ShardInfo]:
    return [
        ShardInfo(
            names.format(i),
            i % 7 + 1,
            1024 * (i + 2),
            f"{i:064x}" if sha else None,
            names.format(i).replace(".tar", ".idx") if i % 3 else None,
        )
        for i in range(count)
    ]


@pytest.mark.parametrize("names", ["shard-{:06d}.tar", "part/{}-x.tar", "{:03d}.tar"])
@pytest.mark.parametrize("sha", [True, False])
def test_table_round_trips_every_field(names: str, sha: bool) -> None:
    shards = _shards(40, names, sha)
    table = ShardTable.of(shards)
    assert list(decode_table(encode_table(table))) == shards == list(table)
    assert table.total_samples == sum(s.num_samples for s in shards)
    assert table[-1] == shards[-1] and table[3:5] == shards[3:5]


def test_counted_names_are_a_template_and_others_a_blob() -> None:
    assert NameColumn.of(f"{i:05d}.tar" for i in range(7, 20)).template == ("", 5, ".tar", 7)
    assert NameColumn.of(["b.tar", "a.tar"]).template is None


def test_large_manifests_go_to_the_table_and_read_back(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manifest_module, "INLINE_MAX_SHARDS", 10)
    manifest = Manifest(shards=_shards(25), class_names=("a",), settings={"seed": 1})
    write_manifest(tmp_path, manifest)
    document = json.loads((tmp_path / "manifest.json").read_text())
    assert document["format_version"] == 2 and "shards" not in document
    assert document["shard_table"]["num_bytes"] == (tmp_path / "manifest.shards").stat().st_size
    loaded = read_manifest(tmp_path)
    assert loaded == manifest and loaded.format_version == 2
    out = io.StringIO()
    loaded.write_json(out)  # inline again, streamed shard by shard
    assert Manifest.from_json(out.getvalue()) == manifest


def test_a_table_refuses_what_a_json_manifest_refuses(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manifest_module, "INLINE_MAX_SHARDS", 1)
    write_manifest(tmp_path, Manifest(shards=_shards(3)))
    table = tmp_path / "manifest.shards"
    good = table.read_bytes()
    cases = {
        "truncated": good[: len(good) // 2],
        "bad magic": b"X" + good[1:],
        "negative count": good[:32] + np.array([-1], "<i8").tobytes() + good[40:],
    }
    for what, data in cases.items():
        table.write_bytes(data)
        with pytest.raises(ManifestError):
            read_manifest(tmp_path)
        assert what
    table.unlink()
    with pytest.raises(ManifestError, match="missing"):
        read_manifest(tmp_path)
    for bad in ("../up.tar", "/abs.tar", "a/../../b.tar", "s3://x/y.tar", ""):
        data = encode_table(ShardTable.of([ShardInfo(bad, 1, 1, None)]))
        with pytest.raises(ManifestError, match="inside the dataset"):
            decode_table(data)


def test_writing_a_table_refuses_a_shard_listed_twice(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manifest_module, "INLINE_MAX_SHARDS", 1)
    shards = [ShardInfo("a.tar", 1, 1, None), ShardInfo("a.tar", 1, 1, None)]
    with pytest.raises(ManifestError, match="twice"):
        write_manifest(tmp_path, Manifest(shards=shards))


def test_indexed_shards_are_counted_from_the_column() -> None:
    from shardstream._format.shardtable import ShardInfo, ShardTable

    mixed = [ShardInfo("a.tar", 1, 10, None, "a.idx"), ShardInfo("b.tar.gz", 1, 10, None),
             ShardInfo("c.tar", 1, 10, None, "c.idx")]  # fmt: skip
    assert ShardTable.of(mixed).num_indexed == 2
    counted = [ShardInfo(f"shard-{i:06d}.tar", 1, 10, None, f"shard-{i:06d}.idx") for i in range(5)]
    assert ShardTable.of(counted).num_indexed == 5
    assert ShardTable.of([ShardInfo("x.tar.gz", 1, 10, None)]).num_indexed == 0
