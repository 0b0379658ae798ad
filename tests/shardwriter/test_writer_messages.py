"""Writer failures tell their cause and the fix that fits it, in one line: a full disk, a
read-only folder, missing credentials, a wrong endpoint, a second build in the same folder, a
script that spawns workers without a main guard."""

from __future__ import annotations

import errno
import os
import pathlib
import socket
import subprocess
import sys
import textwrap

import pytest

from shardstream import DatasetExistsError, build_shards, read_manifest
from shardstream._cli import main
from shardstream._format.verify import verify_dataset
from shardstream._storage import Store
from shardstream._storage.messages import explain
from shardstream._storage.store import LOCK_NAME, destination_lock


class NoCredentialsError(Exception):
    """Named like botocore's: recognised by name, as botocore is not imported."""


def test_each_cause_gets_its_own_advice() -> None:
    full = explain(OSError(errno.ENOSPC, "No space left on device", "/d/shard.tar"))
    assert full is not None and full.startswith("no space left") and "URL" not in full
    assert "read-only" in (explain(OSError(errno.EROFS, "Read-only", "/d")) or "")
    denied = explain(PermissionError(errno.EACCES, "Permission denied", "/d/x"))
    assert denied is not None and "permissions" in denied and "credentials" not in denied
    try:
        try:
            raise ConnectionRefusedError(111, "Connect call failed")
        except ConnectionRefusedError as inner:
            raise RuntimeError("wrapped by a client library") from inner
    except RuntimeError as outer:
        assert "endpoint_url" in (explain(outer) or "")
    assert "AWS_ACCESS_KEY_ID" in (explain(NoCredentialsError("Unable to locate")) or "")
    assert explain(ValueError("a bug")) is None  # not a storage failure: not disguised as one


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_wrong_endpoint_is_one_line_for_every_command(
    image_folder: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint = f"endpoint_url=http://127.0.0.1:{_free_port()}"
    options = ["--storage-option", endpoint, "--storage-option", "key=a",
               "--storage-option", "secret=b"]  # fmt: skip
    for command in (["build", str(image_folder), "s3://bucket/x"], ["index", "s3://bucket/x"]):
        assert main([*command, *options]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert "cannot connect to the storage endpoint" in err and "endpoint_url" in err


def test_a_full_disk_says_so(
    image_folder: pathlib.Path,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def full(descriptor: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    assert main(["build", str(image_folder), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no space left on the device") and "--storage-option" not in err


def test_a_second_build_into_the_same_folder_is_refused_and_harms_nothing(
    image_folder: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    dest = tmp_path / "out"
    with destination_lock(Store(str(dest))):  # a build running now
        with pytest.raises(DatasetExistsError, match="another shardstream build is writing"):
            build_shards(image_folder, dest)
        assert os.listdir(dest) == [LOCK_NAME]
    # A build killed while it held the lock leaves no stale lock: the kernel drops it.
    holder = "from shardstream._storage.store import destination_lock as l\n" \
             "from shardstream._storage import Store\nimport os, sys\n" \
             "with l(Store(sys.argv[1])):\n    os.kill(os.getpid(), 9)\n"  # fmt: skip
    subprocess.run([sys.executable, "-c", holder, str(dest)], check=False, timeout=60)
    manifest = build_shards(image_folder, dest)
    assert verify_dataset(dest) == manifest == read_manifest(dest)
    assert LOCK_NAME not in os.listdir(dest)


def test_workers_spawned_from_a_script_without_a_main_guard_explain_the_fix(
    image_folder: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, threading, time
            from shardstream import build_shards
            threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # as torch does
            build_shards(sys.argv[1], sys.argv[2], workers=2)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script), str(image_folder), str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, check=False,
        cwd=pathlib.Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("shardstream.errors.ConfigError") and '__name__ == "__main__"' in last
