"""The command line against S3: storage options, no leaked secret, kill-and-resume."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from shardstream._cli import main
from shardstream._format.manifest import read_manifest
from tests.s3.faultproxy import FaultProxy
from tests.s3.s3env import ACCESS_KEY, BUCKET, SECRET_KEY

STATE = "_shardstream_build"


def s3_args(endpoint_url: str) -> list[str]:
    """``--storage-option`` flags for the test server, with the (dummy) secret passed in."""
    flags = [f"endpoint_url={endpoint_url}", f"key={ACCESS_KEY}", f"secret={SECRET_KEY}"]
    return [arg for flag in flags for arg in ("--storage-option", flag)]


def test_build_inspect_verify_on_s3(
    make_image_folder: Callable[..., pathlib.Path],
    moto_endpoint: str,
    moto_fs: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    images = make_image_folder(num_classes=2, per_class=6)
    dest = f"s3://{BUCKET}/cli/train"
    options = s3_args(moto_endpoint)
    assert main(["build", str(images), dest, "--max-samples-per-shard", "5", "-q", *options]) == 0
    assert main(["inspect", dest, *options]) == 0
    assert main(["verify", dest, *options]) == 0
    out, err = capsys.readouterr()
    assert "12 samples in 3 shards" in out and "samples:  12" in out
    assert "OK, 3 shards, 12 samples" in out
    assert SECRET_KEY not in out + err
    moto_fs.pipe_file(f"{dest}/shard-000001.tar", b"not the shard")
    assert main(["verify", dest, *options]) == 1
    out, err = capsys.readouterr()
    assert "MISMATCH shard-000001.tar" in out and SECRET_KEY not in out + err
    assert main(["inspect", f"s3://{BUCKET}/missing", *options]) == 1
    err = capsys.readouterr().err
    assert "no manifest" in err and SECRET_KEY not in err


def cli_command(source: pathlib.Path, dest: str, endpoint_url: str) -> list[str]:
    # `python -m shardstream` is the `shardstream` console script, found without PATH.
    return [
        sys.executable, "-m", "shardstream", "-v", "build", str(source), dest,
        "--max-samples-per-shard", "5", "--workers", "1", "-q", *s3_args(endpoint_url),
    ]  # fmt: skip


def keys_under(fs: Any, prefix: str) -> list[str]:
    fs.invalidate_cache()
    return sorted(path.split(prefix + "/", 1)[1] for path in fs.find(prefix))


def kill_after_first_record(process: subprocess.Popen[bytes], fs: Any, prefix: str) -> None:
    """SIGKILL ``process`` as soon as a chunk record of its build is on the server."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        fs.invalidate_cache()
        names = [path.rsplit("/", 1)[-1] for path in fs.find(f"{prefix}/{STATE}")]
        if any(name.startswith("chunk-") and name.endswith(".json") for name in names):
            process.send_signal(signal.SIGKILL)
            process.wait(30)
            return
        time.sleep(0.02)
    raise AssertionError(f"build exited ({process.returncode}) before a chunk record appeared")


@pytest.mark.timeout(240)
def test_killed_cli_build_resumes_on_s3(
    make_image_folder: Callable[..., pathlib.Path],
    moto_endpoint: str,
    fault_proxy: FaultProxy,
    moto_fs: Any,
) -> None:
    images = make_image_folder(num_classes=3, per_class=20, png_every=0, nested=False)
    killed, clean = f"{BUCKET}/resume/killed", f"{BUCKET}/resume/clean"
    # Slow the first run down on the wire (every part and record upload waits), not in code.
    fault_proxy.add(method="PUT", path_contains="/chunk-", times=0, action="stall", stall_s=0.3)
    command = cli_command(images, f"s3://{killed}", fault_proxy.endpoint_url)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        kill_after_first_record(process, moto_fs, killed)
    finally:
        if process.poll() is None:
            process.kill()
        _, first_err = process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL
    assert "manifest.json" not in keys_under(moto_fs, killed)
    fault_proxy.clear()
    resumed = subprocess.run(
        cli_command(images, f"s3://{killed}", moto_endpoint), capture_output=True, timeout=120
    )
    assert resumed.returncode == 0, resumed.stderr.decode()
    done = re.search(rb"resuming; (\d+) of 12 chunks already written", resumed.stderr)
    assert done is not None and 1 <= int(done.group(1)) < 12, resumed.stderr.decode()
    reference = subprocess.run(
        cli_command(images, f"s3://{clean}", moto_endpoint), capture_output=True, timeout=120
    )
    assert reference.returncode == 0, reference.stderr.decode()
    storage = {"endpoint_url": moto_endpoint}
    got, want = read_manifest(f"s3://{killed}", storage), read_manifest(f"s3://{clean}", storage)
    assert got.shards == want.shards and len(got.shards) == 12 and got.num_samples == 60
    names = [name for shard in got.shards for name in (shard.name, shard.index)]
    expected = sorted(["_info.json", "manifest.json", *names])
    assert keys_under(moto_fs, killed) == expected  # no stray, no state
    for name in names:
        assert moto_fs.cat_file(f"{killed}/{name}") == moto_fs.cat_file(f"{clean}/{name}")
    for output in (first_err, resumed.stdout, resumed.stderr, reference.stderr):
        assert SECRET_KEY.encode() not in output
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == SECRET_KEY  # the env held it as well
