"""The resume-state format: one codec builds and reads the loader's state, the dataset's
per-worker state and the pass a loader posts to its workers.

These pin format version 4 (its keys and their order) so a change to the resume protocol is a
deliberate one; states saved by earlier releases still load, older formats are refused, and a
field added in ``resumestate.py`` alone round-trips.
"""

from __future__ import annotations

import pathlib
import sys
import types

import pytest

from shardstream.errors import ConfigError
from shardstream.streaming._control import resumestate
from shardstream.streaming._control.resumestate import (
    STATE_VERSION,
    PassState,
    SavedState,
    WorkerPosition,
    check_fingerprint,
    decode_pass,
    decode_state,
    encode_pass,
    encode_state,
)
from shardstream.streaming._planning.leftover import PassRecord
from shardstream.streaming._planning.split import Layout

PASS = ["epoch", "history", "plan", "consumed_batches", "dataset_version"]
LAYOUT = ["world_size", "num_workers", "batch_size"]


def _state() -> PassState:
    return PassState(2, (PassRecord(Layout(4, 2, 8), 3),), Layout(2, 2, 16), 5, (1, 2))


def test_a_loader_state_is_format_5_and_round_trips() -> None:
    encoded = encode_state(_state(), Layout(2, 3, 16), {"seed": 0})
    assert STATE_VERSION == 5
    assert list(encoded) == ["version", *PASS, *LAYOUT, "fingerprint"]
    assert encoded["history"] == [
        {"world_size": 4, "num_workers": 2, "batch_size": 8, "consumed_steps": 3}
    ]
    assert encoded["dataset_version"] == [1, 2]  # plain values: a list, not a tuple
    assert decode_state(encoded) == SavedState(_state(), Layout(2, 3, 16), {"seed": 0})


def test_a_worker_state_adds_its_position_between_the_pass_and_the_layout() -> None:
    position = WorkerPosition(start=4, role=1, served=2, token=99, worker=1)
    encoded = encode_state(_state(), Layout(2, 3, 16), {}, position)
    worker = ["start", "role", "served", "token", "worker"]
    assert list(encoded) == ["version", *PASS, *worker, *LAYOUT, "fingerprint"]
    assert [encoded[name] for name in worker] == [4, 1, 2, 99, 1]
    assert decode_state(encoded).worker == position


def test_a_loader_state_may_add_its_global_batch_count_last() -> None:
    encoded = encode_state(_state(), Layout(2, 3, 16), {"seed": 0}, global_batches=41)
    assert list(encoded) == ["version", *PASS, *LAYOUT, "fingerprint", "global_batches"]
    assert encoded["global_batches"] == 41 and encoded["version"] == STATE_VERSION
    assert decode_state(encoded).global_batches == 41


def test_the_pass_a_loader_posts_round_trips_through_json_values() -> None:
    encoded = encode_pass(_state())
    assert list(encoded) == PASS
    assert decode_pass(encoded) == _state()


def test_states_saved_by_earlier_releases_load() -> None:
    # format 3 (the whole-shard order): no chunks, no dataset versions, no global batch count.
    release_02 = {
        "version": 3, "epoch": 1, "history": [], "plan": LAYOUT_DICT, "consumed_batches": 7,
        **LAYOUT_DICT, "fingerprint": {"seed": 0, "num_open": 64, "piece_size": 64},
    }  # fmt: skip
    saved = decode_state(release_02)
    assert saved.state == PassState(1, (), Layout(2, 4, 8), 7, None)
    assert not saved.versioned and saved.global_batches is None and saved.worker is None
    # A per-worker state from before dataset versions: no dataset_version key.
    worker = {
        "version": 4, "epoch": 0, "history": [], "plan": None, "consumed_batches": 0,
        "start": 3, "role": 0, "served": 1, "token": 5, "worker": 0, **LAYOUT_DICT,
        "fingerprint": {},
    }  # fmt: skip
    saved = decode_state(worker)
    assert saved.worker == WorkerPosition(3, 0, 1, 5, 0) and not saved.versioned


LAYOUT_DICT = {"world_size": 2, "num_workers": 4, "batch_size": 8}


def test_older_formats_and_malformed_states_are_refused() -> None:
    with pytest.raises(ConfigError, match="version 2 is not supported"):
        decode_state({"version": 2})
    with pytest.raises(ConfigError, match=r"malformed resume state.*epoch"):
        decode_state({"version": 4, **LAYOUT_DICT, "fingerprint": {}})
    with pytest.raises(ConfigError, match=r"malformed resume state.*world_size"):
        decode_state({"version": 4, "epoch": 0, "fingerprint": {}})
    order = {"num_open": 4, "piece_size": 8, "seed": 0}
    # version 3: read whole shards, in the uniform interleave
    check_fingerprint(order, {**order, "chunk_size": 0, "interleave": "uniform"})
    with pytest.raises(ConfigError, match=r"state \(format 3\) was saved in the whole-shard order"):
        check_fingerprint(order, {**order, "chunk_size": 64, "interleave": "uniform"})
    with pytest.raises(ConfigError, match=r"interleave='uniform'\)"):
        check_fingerprint(order, {**order, "chunk_size": 0, "interleave": "stratified"})


def test_states_saved_before_the_stratified_interleave_continue_only_in_the_uniform_one() -> None:
    saved = {"seed": 0, "chunk_size": 8, "num_open": 4, "piece_size": 8}  # format 4
    check_fingerprint(saved, {**saved, "interleave": "uniform"})
    with pytest.raises(ConfigError, match=r"format 4.*StreamOptions\(interleave='uniform'\)"):
        check_fingerprint(saved, {**saved, "interleave": "stratified"})
    today = {**saved, "interleave": "stratified"}
    check_fingerprint(today, today)
    with pytest.raises(ConfigError, match=r"interleave was 'stratified'.*'uniform' now"):
        check_fingerprint(today, {**saved, "interleave": "uniform"})


def test_a_field_added_in_this_module_alone_round_trips_and_older_states_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A change of the format touches ``resumestate.py`` and this test: add one line, a field
    of ``PassState``, to a copy of the module, and the copy saves it, reads it back, and reads
    today's states (without it) with its default."""
    path = pathlib.Path(resumestate.__file__)
    source = path.read_text()
    anchor = "    dataset_version: VersionNumber = None\n"
    assert source.count(anchor) == 1
    copy = types.ModuleType("resumestate_with_a_field")
    monkeypatch.setitem(sys.modules, copy.__name__, copy)  # dataclasses look their module up
    exec(compile(source.replace(anchor, anchor + "    note: int = 0\n"), str(path), "exec"),
         copy.__dict__)  # fmt: skip
    state = copy.PassState(3, consumed=2, note=7)
    encoded = copy.encode_state(state, Layout(1, 1, 4), {})
    assert encoded["note"] == 7
    assert copy.decode_state(encoded).state == state
    assert copy.decode_pass(copy.encode_pass(state)) == state
    today = encode_state(PassState(3, consumed=2), Layout(1, 1, 4), {})
    assert copy.decode_state(today).state == copy.PassState(3, consumed=2, note=0)
