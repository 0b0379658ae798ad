"""The shardstream command line: build, inspect, verify, and size parsing."""

from __future__ import annotations

import argparse
import json

import pytest

from shardstream._cli import main, parse_size


def test_parse_size_accepts_units():
    assert parse_size("256MB") == 256_000_000
    assert parse_size("1GiB") == 2**30
    assert parse_size("1000000") == 1_000_000
    assert parse_size("1.5kb") == 1500
    with pytest.raises(argparse.ArgumentTypeError, match="invalid size"):
        parse_size("12 parsecs")


def test_build_inspect_verify(image_folder, tmp_path, capsys):
    dest = str(tmp_path / "out")
    assert (
        main(
            [
                "build",
                str(image_folder),
                dest,
                "--max-samples-per-shard",
                "5",
                "--max-bytes-per-shard",
                "1MB",
                "--workers",
                "2",
                "--seed",
                "3",
                "-q",
            ]
        )
        == 0
    )
    assert "12 samples in 3 shards" in capsys.readouterr().out
    assert main(["inspect", dest]) == 0
    out = capsys.readouterr().out
    assert "samples:  12" in out and "classes:  3 (class_00, class_01, class_02)" in out
    assert main(["inspect", dest, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["settings"]["seed"] == 3
    assert main(["verify", dest]) == 0
    assert "OK, 3 shards, 12 samples" in capsys.readouterr().out


def test_verify_exits_non_zero_listing_mismatches(image_folder, tmp_path, capsys):
    dest = tmp_path / "out"
    assert main(["build", str(image_folder), str(dest), "--max-samples-per-shard", "5"]) == 0
    shard = dest / "shard-000002.tar"
    shard.write_bytes(shard.read_bytes()[:-1024])
    capsys.readouterr()
    assert main(["verify", str(dest)]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH shard-000002.tar: size expected" in out


def test_errors_are_one_clear_line(tmp_path, capsys):
    assert main(["build", str(tmp_path / "missing"), str(tmp_path / "out")]) == 1
    assert "error:" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path)]) == 1
    assert "no manifest" in capsys.readouterr().err


def test_resize_and_skip_flags(make_image_folder, tmp_path, capsys):
    root = make_image_folder(num_classes=2, per_class=3)
    (root / "class_00" / "broken.jpg").write_bytes(b"nope")
    assert (
        main(
            [
                "build",
                str(root),
                str(tmp_path / "out"),
                "--resize",
                "16",
                "--quality",
                "70",
                "--on-error",
                "skip",
                "--no-shuffle",
            ]
        )
        == 0
    )
    assert "6 samples in 1 shards" in capsys.readouterr().out
    with pytest.raises(SystemExit) as usage:
        main(["build", str(root), str(tmp_path / "out2"), "--seed", "1", "--no-shuffle"])
    assert usage.value.code == 2


def test_storage_option_values_are_json_when_they_parse():
    from shardstream._cli import parse_storage_option

    assert parse_storage_option("endpoint_url=http://127.0.0.1:9000") == (
        "endpoint_url",
        "http://127.0.0.1:9000",
    )
    assert parse_storage_option("anon=false") == ("anon", False)
    assert parse_storage_option("max_concurrency=8") == ("max_concurrency", 8)
    assert parse_storage_option('client_kwargs={"region_name": "eu"}') == (
        "client_kwargs",
        {"region_name": "eu"},
    )
    assert parse_storage_option("token=a=b") == ("token", "a=b")
    with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE"):
        parse_storage_option("no-equals-sign")


SECRET = "cli-s3cr3t-value-0123"


def test_storage_options_reach_the_api_and_errors_hide_secrets(
    image_folder, tmp_path, capsys, monkeypatch
):
    import shardstream.shardwriter as writer
    from shardstream.errors import DatasetExistsError

    seen = {}

    def fake_build(source, dest, options, *, storage_options=None, progress=None):
        seen.update(storage_options)
        raise DatasetExistsError(f"{dest}: refused (options {storage_options})")

    monkeypatch.setattr(writer, "build_shards", fake_build)
    argv = ["build", str(image_folder), f"s3://user:{SECRET}x@bucket/out", "-q"]
    argv += ["--storage-option", f"secret={SECRET}", "--storage-option", "anon=false"]
    assert main(argv) == 1
    assert seen == {"secret": SECRET, "anon": False}
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "***" in err
    assert SECRET not in err


def test_log_lines_are_redacted():
    import logging

    from shardstream._cli import _RedactingFormatter

    formatter = _RedactingFormatter("%(message)s", [SECRET])
    record = logging.LogRecord(
        "x", logging.INFO, __file__, 1, "%s failed with %s", ("s3://a:b@bkt/k", SECRET), None
    )
    text = formatter.format(record)
    assert SECRET not in text and ":b@" not in text and text.count("***") == 2


def test_index_view_and_merge_commands(image_folder, tmp_path, capsys):
    from shardstream import read_manifest, write_partition
    from tests.streaming.shards import make_samples

    built = tmp_path / "built"
    assert main(["build", "-q", str(image_folder), str(built), "--max-samples-per-shard", "5"]) == 0
    for path in [*built.glob("*.idx"), built / "manifest.json", built / "_info.json"]:
        path.unlink()  # now plain shards, as another tool leaves them
    assert main(["index", "-q", str(built), "--workers", "2", "--no-checksum"]) == 0
    assert "indexed 3 shards, 12 samples" in capsys.readouterr().out
    assert main(["verify", str(built)]) == 0
    assert main(["view", str(built), str(tmp_path / "split"), "--split", "a=0.5,b=0.5"]) == 0
    counts = [read_manifest(tmp_path / "split" / n).num_samples for n in ("a", "b")]
    assert sum(counts) == 12
    assert main(["view", str(built), str(tmp_path / "v"), "--split", "oops"]) == 1
    assert "NAME=SHARE" in capsys.readouterr().err
    samples = make_samples(9)
    write_partition(samples[:4], tmp_path / "parts", 0)
    write_partition(samples[4:], tmp_path / "parts", 1)
    assert main(["merge", str(tmp_path / "parts"), "--partitions", "2"]) == 0
    assert "merged 2 partitions, 2 shards, 9 samples" in capsys.readouterr().out


def test_inspect_shows_spread_files_and_class_balance(tmp_path, capsys):
    from shardstream import build_shards
    from tests.streaming.shards import make_samples

    build_shards(make_samples(30, num_classes=3), tmp_path / "ds", max_samples_per_shard=8)
    assert main(["inspect", str(tmp_path / "ds"), "--classes", "99"]) == 0
    out = capsys.readouterr().out
    assert "per shard: samples min 6 / median 8 / max 8" in out
    assert "_info.json: timm" in out and "indexed:  4 of 4 shards" in out
    assert "3 labels in 4 of 4 shards: samples per class min 10 / median 10 / max 10" in out
    assert main(["inspect", str(tmp_path / "ds"), "--classes", "2"]) == 0
    assert "in 2 of 4 shards (estimate)" in capsys.readouterr().out
