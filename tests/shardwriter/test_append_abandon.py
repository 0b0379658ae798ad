"""Abandoning a killed append: `shardstream abandon` removes what it left, the next append works.

A killed append is finished by running it again; when it is not to be finished, what it left
(its build state, shards renamed into the dataset, a versioned manifest not yet published)
would refuse the next append. After ``abandon`` the next append gives exactly the dataset an
append onto the published version gives when nothing was ever killed.
"""

from __future__ import annotations

import pathlib
import shutil
import signal
import subprocess
import sys
from typing import Any

import pytest

from shardstream._format.manifest import read_manifest
from shardstream._format.verify import find_problems
from shardstream._storage import Store
from shardstream.errors import ConfigError, DatasetExistsError
from shardstream.shardwriter import build_shards
from shardstream.shardwriter._append import abandon_append

from .growth import write_day
from .helpers import dataset_bytes
from .test_append_kills import OPTIONS, STATE, _append_and_kill_at, _in_child


@pytest.fixture(scope="module")
def days(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Day 1 to 3 trees, and the bytes of day 1's dataset with day 3 appended (never killed)."""
    root = tmp_path_factory.mktemp("append-abandon")
    found = {f"day{day}": write_day(root / f"day{day}", day) for day in (1, 2, 3)}
    clean = root / "clean"
    build_shards(found["day1"], clean, **OPTIONS)
    build_shards(found["day3"], clean, append=True, **OPTIONS)
    return {**found, "clean": dataset_bytes(clean)}


def _killed(days: dict[str, Any], tmp_path: pathlib.Path, point: str, nth: int) -> pathlib.Path:
    """Day 1's dataset with an append of day 2 killed at ``point``."""
    dest = tmp_path / "ds"
    build_shards(days["day1"], dest, **OPTIONS)
    child = _in_child(_append_and_kill_at, point, nth, days["day2"], dest)
    child.join(timeout=120)
    assert child.exitcode == -signal.SIGKILL, f"the append never reached {point} #{nth}"
    return dest


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "shardstream", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("point", "nth"), [("mid-rename", 4), ("versioned-manifest", 1)])
def test_abandon_then_append_another_source(days, tmp_path, point, nth):
    dest = _killed(days, tmp_path, point, nth)
    with pytest.raises(DatasetExistsError, match=f"shardstream abandon {dest}"):
        build_shards(days["day3"], dest, append=True, **OPTIONS)
    listed = _cli("abandon", str(dest), "--dry-run")
    assert listed.returncode == 0 and "would remove" in listed.stdout
    assert f"{STATE}/" in listed.stdout and (dest / STATE).exists()
    done = _cli("abandon", str(dest))
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n  ") == listed.stdout.count("\n  ")
    build_shards(days["day3"], dest, append=True, **OPTIONS)
    assert dataset_bytes(dest) == days["clean"]  # as if day 2 had never been started
    assert find_problems(Store(str(dest)), read_manifest(str(dest))) == []


def test_abandon_after_the_build_state_was_removed_by_hand(days, tmp_path):
    dest = _killed(days, tmp_path, "mid-rename", 4)
    shutil.rmtree(dest / STATE)  # what the message used to say
    with pytest.raises(DatasetExistsError, match="exists already") as refused:
        build_shards(days["day3"], dest, append=True, **OPTIONS)
    assert "shardstream abandon" in str(refused.value)
    assert "shardstream index" not in str(refused.value)  # it would publish day 2's shards
    assert not (dest / STATE).exists()  # the refused append left no claim behind
    removed = abandon_append(dest)
    assert removed and all(name.startswith("shard-") for name in removed)
    build_shards(days["day3"], dest, append=True, **OPTIONS)
    assert dataset_bytes(dest) == days["clean"]


def test_abandon_keeps_a_finished_append_and_refuses_a_build(days, tmp_path):
    dest = tmp_path / "ds"
    build_shards(days["day1"], dest, **OPTIONS)
    build_shards(days["day3"], dest, append=True, **OPTIONS)
    assert abandon_append(dest) == [] and dataset_bytes(dest) == days["clean"]
    (dest / STATE).mkdir()
    (dest / STATE / "plan.json").write_text('{"source_path": "elsewhere"}')  # a build's plan
    with pytest.raises(ConfigError, match="holds an unfinished build, not an append"):
        abandon_append(dest)
