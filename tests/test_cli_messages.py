"""What the command line says: plain help, its version, flags in any place, one-line errors in
the command line's own spellings, and a quiet end when the reader of its output goes away."""

from __future__ import annotations

import logging
import pathlib
import subprocess
import sys

import pytest

from shardstream import __version__
from shardstream._cli import SUBCOMMANDS, main
from shardstream._format.manifest import read_manifest
from shardstream.shardwriter import build_shards
from tests.conftest import write_image_folder
from tests.streaming.shards import make_samples


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardstream", *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def dataset(tmp_path: pathlib.Path) -> pathlib.Path:
    root = tmp_path / "data"
    build_shards(make_samples(12, num_classes=3), root, max_samples_per_shard=4)
    return root


def test_help_is_plain_text_and_the_version_is_shown(capsys: pytest.CaptureFixture[str]) -> None:
    commands = [
        "build",
        "inspect",
        "verify",
        "index",
        "view",
        "merge",
        "bench",
        "prune",
        "abandon",
        "exclude",
        "compact",
        "dups",
        "attach",
    ]
    assert len(commands) == len(SUBCOMMANDS)
    for argv in (["--help"], *([command, "--help"] for command in commands)):
        with pytest.raises(SystemExit) as done:
            main(argv)
        text = capsys.readouterr().out
        assert done.value.code == 0 and "usage: shardstream" in text
        assert "``" not in text and ":func:" not in text and ":class:" not in text, text
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"shardstream {__version__}\n"


def test_inspect_names_the_dataset_version_at_version(
    dataset: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", str(dataset), "--at-version", "1"]) == 0
    assert "version:  1" in capsys.readouterr().out
    assert main(["inspect", str(dataset), "--version", "1"]) == 0  # the old spelling still works
    captured = capsys.readouterr()
    assert "version:  1" in captured.out and "use --at-version" in captured.err
    assert main(["inspect", str(dataset), "--at-version", "2"]) == 1
    err = capsys.readouterr().err
    assert "has no version 2" in err and "without --at-version" in err
    assert "version=None" not in err


def test_verbose_and_quiet_work_after_the_subcommand_too(
    dataset: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    images = write_image_folder(tmp_path / "images")
    after = _cli("build", str(images), str(tmp_path / "a"), "-v", "--quiet")
    before = _cli("-v", "--quiet", "build", str(images), str(tmp_path / "b"))
    for result in (after, before):
        assert result.returncode == 0 and "INFO shardstream" in result.stderr, result.stderr
    assert _cli("verify", str(dataset), "-q", "--verbose").returncode == 0
    assert _cli("inspect", str(dataset), "-v").returncode == 0


def test_errors_use_the_command_line_spellings(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    images = write_image_folder(tmp_path / "images")
    dest = tmp_path / "out"
    assert main(["build", str(images), str(dest), "-q"]) == 0
    assert main(["build", str(images), str(dest), "-q", "--seed", "9"]) == 1
    err = capsys.readouterr().err
    assert "--overwrite" in err and "overwrite=True" not in err, err
    (images / "class_00" / "broken.jpg").write_bytes(b"not a jpeg")
    assert main(["build", str(images), str(tmp_path / "other"), "-q"]) == 1
    err = capsys.readouterr().err
    assert "--on-error skip" in err and "on_error=" not in err, err


def test_a_destination_that_is_a_file_or_inside_the_source_is_refused(
    dataset: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    images = write_image_folder(tmp_path / "images")
    afile = tmp_path / "afile"
    afile.write_text("x")
    for argv in (["build", str(images), str(afile)], ["build", str(images), f"{afile}/sub"],
                 ["index", str(dataset), str(afile)],
                 ["view", str(dataset), str(afile), "--fraction", "0.5"]):  # fmt: skip
        assert main([*argv, "-q"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "a file is in the way" in err, err
        assert err.count("\n") == 1 and "Errno" not in err
    assert afile.read_text() == "x"
    for dest in (images / "shards", images):
        assert main(["build", str(images), str(dest), "-q"]) == 1
        assert "inside the source folder" in capsys.readouterr().err
    assert not list(images.rglob("*.tar"))


def test_a_reader_that_goes_away_ends_the_command_quietly(dataset: pathlib.Path) -> None:
    for args in (["inspect", str(dataset)], ["inspect", str(dataset), "--json"]):
        process = subprocess.Popen(
            [sys.executable, "-m", "shardstream", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()  # `| head` that has read what it wanted
        err = process.stderr.read().decode()
        process.stderr.close()
        assert process.wait(timeout=120) == 141 and err == "", err


def test_view_by_keys_says_which_keys_it_did_not_find(
    dataset: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    keys = tmp_path / "keys.txt"
    keys.write_text("s000001\ns000002\nnope-1\nnope-2\ns000002\n")
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        assert main(["view", str(dataset), str(tmp_path / "v"), "--keys", str(keys), "-q"]) == 0
    assert "2 samples" in capsys.readouterr().out
    said = [record.getMessage() for record in caplog.records]
    assert any(
        "2 of the 4 keys asked for are in no shard (such as 'nope-1', 'nope-2')" in line
        for line in said
    ), said


@pytest.mark.slow
def test_bench_errors_are_one_line_and_it_can_skip(dataset: pathlib.Path) -> None:
    missing = f"{dataset}/shard-{{000000..000003}}.tar"
    result = _cli("bench", missing, "--batches", "2", "--mode", "raw", "-q")
    assert result.returncode == 1 and result.stderr.startswith("error: 1 of the 4 shards")
    assert result.stderr.count("\n") == 1, result.stderr
    (dataset / "shard-000001.tar").write_bytes(b"\0" * 100)  # broken in a worker, mid-epoch
    pattern = f"{dataset}/shard-{{000000..000002}}.tar"
    result = _cli("bench", pattern, "--mode", "raw", "--batch-size", "2", "-q")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("error: ") and "--on-error skip" in result.stderr
    assert "in DataLoader worker process" in result.stderr
    result = _cli("bench", pattern, "--mode", "raw", "--batch-size", "2", "-q",
                  "--on-error", "skip", "--seconds", "1")  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_messages_recommend_only_options_the_command_has(
    dataset: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "foreign"
    folder.mkdir()
    whole = (dataset / "shard-000001.tar").read_bytes()
    (folder / "a.tar").write_bytes((dataset / "shard-000000.tar").read_bytes())
    (folder / "b.tar").write_bytes(whole[: len(whole) // 2])  # truncated
    assert main(["index", str(folder), "-q"]) == 1
    err = capsys.readouterr().err
    assert "b.tar: truncated" in err and "Re-copy or rebuild" in err, err
    assert "on-error" not in err and "on_error" not in err, err
    assert sorted(path.name for path in folder.iterdir()) == ["a.tar", "b.tar"]  # nothing left
    (folder / "b.tar").write_bytes(whole)
    assert main(["index", str(folder), "-q"]) == 0  # fixed: the same command indexes
    assert "indexed 2 shards, 8 samples" in capsys.readouterr().out
    (dataset / "shard-000002.tar").write_bytes(whole[: len(whole) // 2])
    assert main(["verify", str(dataset), "-q"]) == 1
    out = capsys.readouterr().out
    assert "shard-000002.tar: truncated" in out and "on_error" not in out, out
    assert "on-error" not in out


@pytest.mark.parametrize("argv", [["verify", "--decode"], ["inspect", "--classes", "3"]])
def test_a_truncated_shard_read_by_a_command_without_on_error_is_not_told_to_skip(
    dataset: pathlib.Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    whole = (dataset / "shard-000001.tar").read_bytes()
    (dataset / "shard-000001.tar").write_bytes(whole[: len(whole) // 2])
    assert main([argv[0], str(dataset), *argv[1:], "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "shard-000001.tar" in err, err
    assert "Re-copy or rebuild it." in err and "on-error" not in err and "on_error" not in err


def test_a_build_stopped_by_a_broken_image_finishes_with_on_error_skip(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    images = write_image_folder(tmp_path / "images")
    (images / "class_00" / "broken.jpg").write_bytes(b"not a jpeg")
    dest = tmp_path / "out"
    assert main(["build", str(images), str(dest), "-q"]) == 1
    assert "or pass --on-error skip" in capsys.readouterr().err
    assert main(["build", str(images), str(dest), "-q", "--on-error", "skip"]) == 0  # as told
    captured = capsys.readouterr()
    assert "1 skipped" in captured.out, captured
    manifest = read_manifest(dest)
    assert [item.source.endswith("broken.jpg") for item in manifest.skipped] == [True]
    assert "on_error" not in manifest.skipped[0].reason  # it skipped already
    assert manifest.num_samples == len(list(images.rglob("img_*")))
    assert main(["build", str(images), str(dest), "-q", "--seed", "3"]) == 1  # others: refused
    assert "--overwrite" in capsys.readouterr().err


def test_an_append_stopped_by_a_broken_image_finishes_with_on_error_skip(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "out"
    assert main(["build", str(write_image_folder(tmp_path / "day1")), str(dest), "-q"]) == 0
    more = write_image_folder(tmp_path / "day2", per_class=2)
    (more / "class_01" / "cut.jpg").write_bytes(b"\xff\xd8\xff\xe0 cut short")
    assert main(["build", str(more), str(dest), "--append", "-q"]) == 1
    assert "or pass --on-error skip" in capsys.readouterr().err
    assert main(["build", str(more), str(dest), "--append", "--on-error", "skip", "-q"]) == 0
    assert "version 2: 18 samples" in capsys.readouterr().out  # 12 + 6, the cut one skipped
    manifest = read_manifest(dest)
    assert [item.source.endswith("cut.jpg") for item in manifest.skipped] == [True]
    assert not (dest / "_shardstream_build").exists()


def test_small_edges_are_told_plainly(
    dataset: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["view", str(dataset), str(tmp_path / "s"), "--split", "train=0.9,val=0.2"]) == 1
    err = capsys.readouterr().err
    assert "add up to 1" in err and "sum 1.1" in err, err
    assert not (tmp_path / "s").exists()
    for argv, said in [
        (["--split", "train=0.5,train=0.5"], "--split names 'train' twice"),
        (["--fraction", "1.5"], "a view's fraction is more than 0 and at most 1"),
        (["--fraction", "0"], "a view's fraction is more than 0 and at most 1"),
    ]:  # a name given twice was merged (one view of half); 0 wrote a view of no samples
        assert main(["view", str(dataset), str(tmp_path / "s"), *argv, "-q"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: ") and said in err, err
        assert not (tmp_path / "s").exists()
    nowhere = tmp_path / "nowhere"
    for argv in (["inspect", str(nowhere)], ["index", str(nowhere)], ["verify", str(nowhere)],
                 ["view", str(nowhere), str(tmp_path / "v"), "--fraction", "0.5"],
                 ["prune", str(nowhere), "--dry-run"]):  # fmt: skip
        assert main([*argv, "-q"]) == 1
        err = capsys.readouterr().err
        assert f"{nowhere}: does not exist; check the path" in err, err
        assert "build" not in err and "holds no" not in err, err
    result = _cli("index", str(dataset), "--wokers", "2")
    assert result.returncode == 2 and "did you mean --workers?" in result.stderr, result.stderr
    result = _cli("build", str(dataset), str(tmp_path / "x"), "--on-eror", "skip")
    assert "did you mean --on-error?" in result.stderr, result.stderr
    # A command that stops first at its own missing argument still names the flag meant.
    for argv, meant in (
        [["view", str(dataset), str(tmp_path / "v"), "--fration", "0.5"], "--fraction"],
        [["exclude", str(dataset), "--kyes", "k.txt"], "--keys"],
    ):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        err = capsys.readouterr().err
        assert exited.value.code == 2 and f"is required (did you mean {meant}?)" in err, err


def test_inspect_lists_the_attached_fields_and_their_table(
    dataset: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = tmp_path / "scores.csv"
    table.write_text("__key__,score,caption\ns000001,3.5,a\ns000002,4,b\n")
    assert main(["attach", str(dataset), str(table), "-q"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(dataset)]) == 0
    out = capsys.readouterr().out
    assert f"fields:   caption (string), score (double) (attached by version 2 from {table}" in out
