"""The resume-state format: one codec builds both the loader's and the dataset's state dict.

These pin format version 4 (its keys and their order) so a change to the resume protocol is a
deliberate one; version 3 states still load, older ones are refused.
"""

from __future__ import annotations

import pytest

from shardstream.errors import ConfigError
from shardstream.streaming.control.resumestate import (
    STATE_VERSION,
    PassState,
    WorkerPosition,
    check_fingerprint,
    check_version,
    encode_state,
    layout_from_dict,
)
from shardstream.streaming.planning.history import PassRecord
from shardstream.streaming.planning.split import Layout

PASS = ["epoch", "history", "plan", "consumed_batches", "dataset_version"]
LAYOUT = ["world_size", "num_workers", "batch_size"]


def _state() -> PassState:
    return PassState(2, (PassRecord(Layout(4, 2, 8), 3),), Layout(2, 2, 16), 5, (1, 2))


def test_a_loader_state_is_format_4_and_round_trips() -> None:
    encoded = encode_state(_state(), Layout(2, 3, 16), {"seed": 0})
    assert STATE_VERSION == 4
    assert list(encoded) == ["version", *PASS, *LAYOUT, "fingerprint"]
    assert PassState.from_dict(encoded) == _state()
    assert layout_from_dict(encoded) == Layout(2, 3, 16)
    assert encoded["dataset_version"] == [1, 2]  # plain values: a list, not a tuple


def test_a_worker_state_adds_its_position_between_the_pass_and_the_layout() -> None:
    position = WorkerPosition(start=4, role=1, served=2, token=99, worker=1)
    encoded = encode_state(_state(), Layout(2, 3, 16), {}, position)
    worker = ["start", "role", "served", "token", "worker"]
    assert list(encoded) == ["version", *PASS, *worker, *LAYOUT, "fingerprint"]
    assert [encoded[name] for name in worker] == [4, 1, 2, 99, 1]


def test_version_3_states_load_and_older_ones_are_refused() -> None:
    check_version({"version": 3})
    check_version({"version": 4})
    with pytest.raises(ConfigError, match="version 2 is not supported"):
        check_version({"version": 2})
    order = {"num_open": 4, "piece_size": 8, "seed": 0}
    check_fingerprint(order, {**order, "chunk_size": 0})  # version 3: read whole shards
    with pytest.raises(ConfigError, match=r"shardstream 0\.2"):
        check_fingerprint(order, {**order, "chunk_size": 64})


def test_a_loader_state_may_add_its_global_batch_count_last() -> None:
    encoded = encode_state(_state(), Layout(2, 3, 16), {"seed": 0}, global_batches=41)
    assert list(encoded) == ["version", *PASS, *LAYOUT, "fingerprint", "global_batches"]
    assert encoded["global_batches"] == 41 and encoded["version"] == STATE_VERSION
    assert PassState.from_dict(encoded) == _state()
