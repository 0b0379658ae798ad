"""The resume audit: per rank, the keys each step consumed; after restarts, exact numbers.

Runs here are simulated as a training loop lives them: steps recorded, a kill, a restart from
a checkpoint's step (which redoes the steps after it), sometimes with a loader that is not
where the trainer is. The project's own resume and elastic tests use the audit on real loaders
(``tests/streaming/conformance.py``, ``tests/streaming/test_elastic.py``).
"""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys

import pytest
import torch

from shardstream import ConfigError, ResumeAudit

NUM_SAMPLES = 40  # 10 steps of 4 per epoch on one rank


def _keys(step: int) -> list[str]:
    return [f"k{(step * 4 + i) % NUM_SAMPLES:03d}" for i in range(4)]


def _run(folder: pathlib.Path, steps: range, rank: int = 0, shift: int = 0) -> None:
    """One run of a rank: records ``steps``; ``shift`` moves the loader ahead (+) or back (-)."""
    audit = ResumeAudit(folder, rank=rank)
    for step in steps:
        audit.record(step, {"__key__": _keys(step + shift)}, epoch=0)


def _counts(folder: pathlib.Path, **options: int) -> tuple[int, int, int]:
    (epoch,) = ResumeAudit.report(folder, expected=NUM_SAMPLES, **options).epochs
    return epoch.consumed, epoch.duplicates, epoch.skips  # type: ignore[return-value]


def test_redone_steps_after_a_restart_are_not_duplicates(tmp_path: pathlib.Path) -> None:
    _run(tmp_path, range(0, 7))  # killed after step 6; the checkpoint was at step 4
    _run(tmp_path, range(4, 10))
    assert _counts(tmp_path) == (40, 0, 0)
    assert ResumeAudit.report(tmp_path).restarts == [(0, 4)]


def test_a_loader_behind_or_ahead_of_the_trainer_is_counted(tmp_path: pathlib.Path) -> None:
    behind, ahead = tmp_path / "behind", tmp_path / "ahead"
    _run(behind, range(0, 5))
    _run(behind, range(5, 10), shift=-5)  # the loader started over at batch 0
    assert _counts(behind) == (40, 20, 20)
    _run(ahead, range(0, 5))
    _run(ahead, range(5, 8), shift=2)  # restored from a later checkpoint: 2 steps skipped
    assert _counts(ahead) == (32, 0, 8)


def test_another_launch_redoes_every_rank_s_steps(tmp_path: pathlib.Path) -> None:
    """Two ranks, then one rank from the checkpoint at step 2 (an elastic restart)."""
    for rank in range(2):
        audit = ResumeAudit(tmp_path, rank=rank)
        for step in range(4):
            audit.record(step, [f"r{rank}s{step}"])
    audit = ResumeAudit(tmp_path, rank=0)
    for step in range(2, 6):
        audit.record(step, [f"r0s{step}", f"r1s{step}"])
    report = ResumeAudit.report(tmp_path, expected=12)
    assert report.restarts == [(0, 2)]
    assert [(e.consumed, e.duplicates, e.skips) for e in report.epochs] == [(12, 0, 0)]


def test_epochs_count_apart_and_bounded_memory_counts_the_same(tmp_path: pathlib.Path) -> None:
    audit = ResumeAudit(tmp_path, rank=0)
    for step in range(25):  # epoch 0: steps 0-9; epoch 1: 10-19, one batch twice; epoch 2: part
        audit.record(step, {"__key__": _keys(step if step != 15 else 14)}, epoch=step // 10)
    wide = ResumeAudit.report(tmp_path, expected=NUM_SAMPLES)
    narrow = ResumeAudit.report(tmp_path, expected=NUM_SAMPLES, memory_bytes=512)  # 12 passes
    assert wide == narrow
    assert [(e.epoch, e.consumed, e.duplicates, e.skips) for e in wide.epochs] == [
        (0, 40, 0, 0), (1, 40, 4, 4), (2, 20, 0, 20)
    ]  # fmt: skip


def test_fillers_are_left_out_and_keyless_batches_are_refused(tmp_path: pathlib.Path) -> None:
    audit = ResumeAudit(tmp_path, rank=0)
    audit.record(0, {"__key__": ["a", "b", "a"], "__valid__": torch.tensor([True, True, False])})
    audit.record(1, {"__key__": "c", "__valid__": True})
    audit.record(2, {"__key__": "a", "__valid__": False})
    assert _counts_of(tmp_path) == (3, 0)
    with pytest.raises(ConfigError, match="output='dict'"):
        audit.record(3, {"image": torch.zeros(2)})
    with pytest.raises(ConfigError, match="dict batch or keys"):
        audit.record(3, 7)


def _counts_of(folder: pathlib.Path) -> tuple[int, int]:
    (epoch,) = ResumeAudit.report(folder).epochs
    return epoch.consumed, epoch.duplicates


def test_a_run_killed_by_sigkill_keeps_every_recorded_step(tmp_path: pathlib.Path) -> None:
    code = (
        "import os, signal, sys\n"
        "from shardstream import ResumeAudit\n"
        f"audit = ResumeAudit({str(tmp_path)!r}, rank=0)\n"
        "for step in range(6):\n"
        "    audit.record(step, [f'k{step}'])\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL
    assert _counts_of(tmp_path) == (6, 0)
