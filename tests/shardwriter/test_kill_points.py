"""SIGKILL a build anywhere, re-run it, and get exactly the uninterrupted dataset.

Two kinds of kill: at seeded random times of real ``shardstream build`` processes (which land
during start-up and scanning, mid-shard, while shards are renamed, and after the build ended),
and at exact points of an in-process build in a forked child that SIGKILLs itself there (the
library has no test hooks, so the child patches the function at that point).
"""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import random
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from shardstream._format import tarformat as tarwriter
from shardstream._storage.backends.local import LocalBackend
from shardstream.shardwriter import _build as build
from shardstream.shardwriter import _sources as sources
from shardstream.shardwriter import _state as state
from shardstream.shardwriter import build_shards

from ..conftest import encode_image, write_image_folder
from .helpers import dataset_bytes, kill_at

pytestmark = pytest.mark.slow

STATE = "_shardstream_build"
#: Options of the in-process builds: many small shards, images re-encoded.
BUILD_OPTIONS: dict[str, Any] = {"max_samples_per_shard": 2, "resize": 16}

#: name -> (object owning the patched function, its attribute name, ``when(call_args)``).
KILL_POINTS: dict[str, tuple[Any, str, Callable[[tuple], bool]]] = {
    "scanning": (sources._TreeScan, "_scan_files", lambda args: True),
    "mid-shard": (tarwriter.TarShardWriter, "write_member", lambda args: True),
    "mid-rename": (LocalBackend, "move", lambda args: "shard-" in str(args[3])),
    "before-manifest": (build, "write_manifest", lambda args: True),
    "manifest-not-renamed": (os, "replace", lambda args: str(args[1]).endswith("manifest.json")),
    "before-state-removal": (state, "remove_state", lambda args: True),
}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "shardstream", "build", *args, "--quiet"]


def _run_to_completion(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def _timed_clean_build(command: list[str], dest: pathlib.Path) -> tuple[float, float]:
    """Run a build to its end; return when its scan ended and when it ended, in seconds.

    The scan has ended when the build-state folder appears (start-up time included).
    """
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    scanned_s = None
    while process.poll() is None:
        if scanned_s is None and (dest / STATE).exists():
            scanned_s = time.monotonic() - start
        time.sleep(0.002)
    ended_s = time.monotonic() - start
    _, errors = process.communicate()
    assert process.returncode == 0, errors
    return scanned_s or ended_s / 2, ended_s


def _run_and_kill(command: list[str], after_s: float, anchor: pathlib.Path | None = None) -> None:
    """Start a build, then SIGKILL it and every worker it started.

    The kill comes ``after_s`` seconds after the start, or after ``anchor`` appeared when one is
    given (so that the varying start-up time does not blur the point).
    """
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    while anchor is not None and not anchor.exists() and process.poll() is None:
        time.sleep(0.001)
    time.sleep(after_s)
    os.killpg(process.pid, signal.SIGKILL)  # a build that already ended is still a zombie here
    process.wait(timeout=30)
    _wait_group_gone(process.pid)


def _wait_group_gone(group: int, timeout_s: float = 30.0) -> None:
    """Wait until no process of ``group`` runs: a killed build's workers share its lock file's
    ``flock``, so a rerun started while one still runs (a loaded machine can be slow to end
    them) would find the destination locked."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = []
        for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rpartition(")")[2].split()
            except OSError:  # the process ended meanwhile
                continue
            if int(fields[2]) == group and fields[0] != "Z":  # state, pgrp
                running.append(stat.parent.name)
        if not running:
            return
        time.sleep(0.01)
    raise AssertionError(f"processes {running} of the killed build still run after {timeout_s}s")


def _assert_no_torn_files(dest: pathlib.Path, clean: dict[str, bytes]) -> None:
    """Whatever a killed build left under a final name is complete: a reader may trust it."""
    for path in dest.iterdir() if dest.exists() else ():
        if path.is_file() and not path.name.startswith("."):
            assert path.read_bytes() == clean[path.name], f"{path.name} differs from a clean build"


def _assert_identical(dest: pathlib.Path, clean: dict[str, bytes]) -> None:
    assert dataset_bytes(dest) == clean
    assert sorted(p.name for p in dest.iterdir()) == sorted(clean), "leftover files or folders"
    assert not (dest / STATE).exists()


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """120 small images (JPEG and PNG, some nested) in 4 classes."""
    root = tmp_path_factory.mktemp("kill") / "images"
    return write_image_folder(root, num_classes=4, per_class=30, size=(40, 32), png_every=5)


@pytest.mark.parametrize(
    "options",
    [
        ["--max-samples-per-shard", "2"],
        ["--max-samples-per-shard", "2", "--resize", "16"],
        ["--max-samples-per-shard", "3", "--resize", "16", "--workers", "2", "--seed", "7"],
    ],
    ids=["original-bytes", "resize", "resize-2-workers"],
)
def test_killed_at_random_times_then_rerun(tree, tmp_path, options):
    clean_dest = tmp_path / "clean"
    scanned_s, ended_s = _timed_clean_build(_cli(str(tree), str(clean_dest), *options), clean_dest)
    clean = dataset_bytes(clean_dest)
    rng = random.Random(f"kill-points {' '.join(options)}")
    # One kill during start-up and scanning; then, timed from the moment the build state
    # appears (the scan is done), one in each equal slice of a clean build's remaining time
    # and a little beyond it (killing a build that has already ended).
    slice_s = 1.15 * (ended_s - scanned_s) / 4
    kills = [(rng.uniform(0.0, scanned_s), False)]
    kills += [(slice_s * (index + rng.random()), True) for index in range(4)]
    for attempt, (after_s, anchored) in enumerate(kills):
        dest = tmp_path / f"killed{attempt}"
        command = _cli(str(tree), str(dest), *options)
        _run_and_kill(command, after_s, dest / STATE if anchored else None)
        _assert_no_torn_files(dest, clean)
        if attempt % 2:  # kill the resumed run too, then finish
            _run_and_kill(command, rng.uniform(0.0, ended_s))
            _assert_no_torn_files(dest, clean)
        _run_to_completion(command)
        _assert_identical(dest, clean)


def _build_and_kill_at(point: str, nth: int, source: pathlib.Path, dest: pathlib.Path) -> None:
    """Forked child: build, with a SIGKILL of this process at the nth matching call of point."""
    kill_at(*KILL_POINTS[point], nth)
    build_shards(source, dest, **BUILD_OPTIONS)


def _killed_in_child(point: str, nth: int, source: pathlib.Path, dest: pathlib.Path) -> None:
    child = multiprocessing.get_context("fork").Process(
        target=_build_and_kill_at, args=(point, nth, source, dest)
    )
    with warnings.catch_warnings():
        # Python 3.12+ warns about forking a process that runs threads; the child only builds.
        warnings.simplefilter("ignore", DeprecationWarning)
        child.start()
    child.join(timeout=120)
    assert child.exitcode == -signal.SIGKILL, f"the build never reached {point} #{nth}"


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, dict]:
    """A 24-image tree and the bytes of its clean build (12 shards)."""
    root = write_image_folder(tmp_path_factory.mktemp("exact") / "images", per_class=8)
    clean_dest = root.parent / "clean"
    build_shards(root, clean_dest, **BUILD_OPTIONS)
    return root, dataset_bytes(clean_dest)


@pytest.mark.parametrize(
    ("point", "nth"),
    [
        ("mid-shard", 7),
        ("mid-rename", 5),
        ("mid-rename", 12),
        ("before-manifest", 1),
        ("manifest-not-renamed", 1),
        ("before-state-removal", 1),
    ],
)
def test_killed_at_an_exact_point_then_rerun(small_tree, tmp_path, point, nth):
    root, clean = small_tree
    dest = tmp_path / "killed"
    _killed_in_child(point, nth, root, dest)
    _assert_no_torn_files(dest, clean)
    if point == "before-manifest":
        shards = sorted(p.name for p in dest.glob("shard-*.tar"))
        assert shards == sorted(n for n in clean if n.startswith("shard-") and n.endswith(".tar"))
        assert not (dest / "manifest.json").exists() and (dest / STATE).is_dir()
    build_shards(root, dest, **BUILD_OPTIONS)
    _assert_identical(dest, clean)


def _write_wide_tree(root: pathlib.Path, num_folders: int) -> pathlib.Path:
    """Many small folders, so a scan takes many directory listings."""
    for index in range(num_folders):
        folder = root / f"class_{index % 5}" / f"part_{index // 5:03d}"
        folder.mkdir(parents=True)
        (folder / f"img_{index:04d}.jpg").write_bytes(encode_image(8, 8, seed=index))
        (folder / "notes.txt").write_text("not an image")
    return root


def test_killed_while_scanning_a_larger_tree(tmp_path):
    root = _write_wide_tree(tmp_path / "wide", num_folders=400)
    clean_dest = tmp_path / "clean"
    build_shards(root, clean_dest, **BUILD_OPTIONS)
    clean = dataset_bytes(clean_dest)
    dest = tmp_path / "killed"
    rng = random.Random("scanning")
    _killed_in_child("mid-shard", rng.randrange(1, 200), root, dest)
    # Killed again while the re-run scans (a scan writes nothing), then finished.
    _killed_in_child("scanning", rng.randrange(1, 400), root, dest)
    _assert_no_torn_files(dest, clean)
    build_shards(root, dest, **BUILD_OPTIONS)
    _assert_identical(dest, clean)


def test_killing_only_the_building_process_ends_its_workers(tmp_path):
    psutil = pytest.importorskip("psutil")
    tree = write_image_folder(tmp_path / "images", num_classes=2, per_class=150, size=(96, 96))
    dest = tmp_path / "out"
    command = _cli(str(tree), str(dest), "--workers", "2", "--resize", "48")
    command += ["--max-samples-per-shard", "4"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parent = psutil.Process(process.pid)
    deadline = time.monotonic() + 60
    workers: list[Any] = []
    while len(workers) < 2 and process.poll() is None and time.monotonic() < deadline:
        workers = parent.children()
        time.sleep(0.01)
    assert len(workers) >= 2, "the build ended before its workers were seen"
    os.kill(process.pid, signal.SIGKILL)  # the building process only, not its process group
    process.wait(timeout=30)
    _, alive = psutil.wait_procs(workers, timeout=15)
    alive = [w for w in alive if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"workers outlived the build: {[w.pid for w in alive]}"
