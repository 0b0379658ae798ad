"""SIGKILL an append at every phase, rerun it, and get exactly the uninterrupted append.

Like ``test_kill_points``: an in-process append in a forked child that SIGKILLs itself at the
nth call of a patched function. After each kill, readers see the old version or the new one,
complete; after the rerun the folder is byte-identical to an append that was never killed.
Also: two appends at once (one waits inside its append while the other starts).
"""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import signal
import subprocess
import sys
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from shardstream._format import tarformat as tarwriter
from shardstream._format.manifest import read_manifest
from shardstream._format.verify import find_problems
from shardstream._storage import Store
from shardstream._storage.backends.local import LocalBackend
from shardstream.shardwriter import _state as state
from shardstream.shardwriter import build_shards

from .growth import write_day
from .helpers import dataset_bytes, kill_at

STATE = "_shardstream_build"
OPTIONS: dict[str, Any] = {"max_samples_per_shard": 2, "resize": 16}
#: Files replaced (atomically) by an append rather than added.
SWAPPED = ("manifest.json", "_info.json")


def _named(fragment: str) -> Callable[[tuple], bool]:
    return lambda args: fragment in str(args[2])  # (backend, fs, path, ...)


#: name -> (object owning the patched function, its attribute name, ``when(call_args)``).
KILL_POINTS: dict[str, tuple[Any, str, Callable[[tuple], bool]]] = {
    "plan-claim": (LocalBackend, "create_exclusive", _named("plan.json")),
    "mid-shard": (tarwriter.TarShardWriter, "write_member", lambda args: True),
    "mid-rename": (LocalBackend, "move", lambda args: "shard-" in str(args[3])),
    "keep-version-1": (LocalBackend, "create_exclusive", _named("manifest.v000001.json")),
    "versioned-manifest": (LocalBackend, "create_exclusive", _named("manifest.v000002.json")),
    "manifest-not-renamed": (os, "replace", lambda args: str(args[1]).endswith("manifest.json")),
    "before-state-removal": (state, "remove_state", lambda args: True),
}


def _append_and_kill_at(point: str, nth: int, source: pathlib.Path, dest: pathlib.Path) -> None:
    """Forked child: append, with a SIGKILL of this process at the nth matching call."""
    kill_at(*KILL_POINTS[point], nth)
    build_shards(source, dest, append=True, **OPTIONS)


def _in_child(target: Callable[..., None], *args: Any) -> multiprocessing.Process:
    child = multiprocessing.get_context("fork").Process(target=target, args=args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # forking a threaded process
        child.start()
    return child


@pytest.fixture(scope="module")
def days(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Day 1 and day 2 trees, day 1's dataset bytes and the bytes after a clean append."""
    root = tmp_path_factory.mktemp("append-kills")
    day1, day2 = write_day(root / "day1", 1), write_day(root / "day2", 2, per_class=5)
    clean = root / "clean"
    build_shards(day1, clean, **OPTIONS)
    base = dataset_bytes(clean)
    build_shards(day2, clean, append=True, **OPTIONS)
    return {"day1": day1, "day2": day2, "base": base, "appended": dataset_bytes(clean)}


def _assert_a_whole_version(dest: pathlib.Path, days: dict[str, Any]) -> None:
    """manifest.json is version 1's or version 2's, and every shard it lists is complete."""
    published = (dest / "manifest.json").read_bytes()
    assert published in (days["base"]["manifest.json"], days["appended"]["manifest.json"])
    assert find_problems(Store(str(dest)), read_manifest(str(dest))) == []
    for path in dest.iterdir():  # nothing under a final name is torn
        if path.is_file() and not path.name.startswith(".") and path.name not in SWAPPED:
            assert path.read_bytes() == days["appended"][path.name], path.name


@pytest.mark.parametrize(
    ("point", "nth"),
    [
        ("plan-claim", 1),
        ("mid-shard", 9),
        ("mid-rename", 1),
        ("mid-rename", 4),
        ("keep-version-1", 1),
        ("versioned-manifest", 1),
        ("manifest-not-renamed", 1),
        ("before-state-removal", 1),
    ],
)
def test_append_killed_at_an_exact_point_then_rerun(days, tmp_path, point, nth):
    dest = tmp_path / "ds"
    build_shards(days["day1"], dest, **OPTIONS)
    child = _in_child(_append_and_kill_at, point, nth, days["day2"], dest)
    child.join(timeout=120)
    assert child.exitcode == -signal.SIGKILL, f"the append never reached {point} #{nth}"
    _assert_a_whole_version(dest, days)
    build_shards(days["day2"], dest, append=True, **OPTIONS)
    assert dataset_bytes(dest) == days["appended"]
    assert not (dest / STATE).exists()
    assert sorted(p.name for p in dest.iterdir()) == sorted(days["appended"])


def _append_holding(source: pathlib.Path, dest: pathlib.Path, ready: Any, go: Any) -> None:
    """Forked child: an append that stops before renaming its shards until ``go`` is set."""
    original = state.finalize_shards

    def waiting(*args: Any, **kwargs: Any) -> Any:
        ready.set()
        go.wait(60)
        return original(*args, **kwargs)

    state.finalize_shards = waiting  # type: ignore[assignment]
    build_shards(source, dest, append=True, **OPTIONS)


def test_two_appends_at_once_one_wins_the_other_is_refused(days, tmp_path):
    dest = tmp_path / "ds"
    build_shards(days["day1"], dest, **OPTIONS)
    context = multiprocessing.get_context("fork")
    ready, go = context.Event(), context.Event()
    first = _in_child(_append_holding, days["day2"], dest, ready, go)
    assert ready.wait(60), "the first append never got to its shards"
    day3 = write_day(tmp_path / "day3", 3)
    command = [sys.executable, "-m", "shardstream", "build", str(day3), str(dest), "--append",
               "--max-samples-per-shard", "2", "--resize", "16", "-q"]  # fmt: skip
    second = subprocess.run(command, capture_output=True, text=True, timeout=120)
    go.set()
    first.join(timeout=120)
    assert first.exitcode == 0
    assert second.returncode == 1
    assert str(dest) in second.stderr and "another shardstream append is writing" in second.stderr
    assert dataset_bytes(dest) == days["appended"]  # the winner's append, as if alone
    # The refused one, run again now, appends on top of the new version.
    again = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert read_manifest(str(dest)).version == 3
